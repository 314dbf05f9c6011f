"""The default sim world runs its rank threads in a sandbox process: a rank that aborts ends as
a named verdict (rank, collective, signal), the world runs on, and no process of the sandbox
outlives its world or its driver."""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

import psutil
import pytest

from harness.check.checkers import check_errors
from harness.check.judge import judge
from harness.check.registry import check_startup
from harness.cli import EXIT_FOUND, main
from harness.errors import ErrorOrigin
from harness.history.step_error import StepError
from harness.scenario import load_scenario, scenario_from_dict
from harness.timeouts import Timeouts
from harness.world import open_world
from harness.world.channel.wire import Channel, ChannelClosed
from harness.world.evidence import native_abort_message
from harness.world.processes.lifecycle import package_pythonpath
from harness.world.sandbox.crash import crash_errors, crashed_history
from harness.world.sandbox.world import SandboxedSimWorld

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"
FAST = Timeouts(collective_s=2.0, hang_s=4.0, step_deadline_s=15.0)
SMALL = {"capture_sizes": [16, 32], "max_num_reqs": 32, "max_num_batched_tokens": 64,
         "decode_threshold": 8, "prefill_threshold": 16}
GONE_WITHIN_S = 15.0
# What gloo printed as it aborted on a size-mismatched all-to-all (torch 2.13, CPU).
GLOO_ABORT = """terminate called after throwing an instance of 'gloo::EnforceNotMet'
  what():  [enforce fail at gloo/transport/tcp/pair.cc:456] op.preamble.length <= op.nbytes. \
1672 vs 456. Received data size doesn't match expected size. Is there a distributed \
collective mismatch in your code?
"""


@pytest.fixture(scope="module")
def sandbox():
    world = SandboxedSimWorld(2, FAST)
    yield world
    assert world.close() == []


def scenario(faults: list | None = None, steps: int = 2):
    return scenario_from_dict({"config": SMALL, "steps": [{"ranks": [20, 24]}] * steps,
                               "faults": faults or []})


def errors_verdict(step):
    return next(v for v in step.verdicts if v.checker == "errors")


def test_the_default_sim_world_is_the_sandboxed_one():
    world = open_world("sim", 2, timeouts=FAST)
    try:
        assert isinstance(world, SandboxedSimWorld)
    finally:
        assert world.close() == []


def test_a_rank_that_aborts_is_named_with_its_signal_and_last_collective_and_the_world_runs_on(
        sandbox):
    assert judge(sandbox.run(scenario())).ok
    launches = sandbox.launches
    result = judge(sandbox.run(scenario([{"kind": "abort_rank", "rank": 1, "step": 1}])))
    assert result.steps[0].ok  # the step before the abort held
    peer, crashed = result.steps[1].records
    assert crashed.error == StepError(
        "RankCrashed", "died of a fatal signal (SIGABRT: Aborted); its last collective: "
        "all_reduce [7, 2] int32", None, ErrorOrigin.INJECTED)
    assert peer.error.kind == "RankLost" and peer.error.origin is ErrorOrigin.LOST
    errors = errors_verdict(result.steps[1])
    assert errors.ok and "rank 1 RankCrashed" in errors.detail  # the injected fault, contained
    assert "Fatal Python error: Aborted" in result.evidence  # every rank's stacks
    assert judge(sandbox.run(scenario())).ok
    assert sandbox.launches == launches + 1  # a fresh runner, only after the death


def test_a_size_mismatched_all_to_all_aborts_and_names_every_rank_with_its_call(sandbox):
    planted = load_scenario(SCENARIOS / "a2a-unpadded-sizes.json")
    result = judge(sandbox.run(planted))
    assert result.steps[0].ok  # replayed graphs keep the sizes they were captured with
    errors = errors_verdict(result.steps[1])
    assert not errors.ok
    # The idle rank's buffers hold 2 rows a peer, its peer's (5 real tokens) 10: the real
    # system aborts in the dispatch, and each rank's call says with what it went in.
    assert re.match(r"rank 0: RankCrashed: died of a fatal signal \((SIGABRT|SIGSEGV)",
                    errors.detail), errors.detail
    assert ("each rank's last collective: rank 0 all_to_all [6, 19] float64; rank 1 "
            "all_to_all [22, 19] float64") in errors.detail
    assert "which rank's call tripped it is not known" in errors.detail
    assert "gloo::EnforceNotMet" in errors.detail
    assert "Received data size doesn't match expected size" in errors.detail
    assert judge(sandbox.run(planted.with_reference_behaviour())).ok


def test_a_runner_killed_between_scenarios_is_named_and_replaced(sandbox):
    assert judge(sandbox.run(scenario())).ok
    os.kill(sandbox.runner_pid, signal.SIGKILL)
    result = judge(sandbox.run(scenario()))
    startup = next(v for v in result.startup_verdicts if v.checker == "startup")
    assert not startup.ok
    assert "RankCrashed: died of a fatal signal (SIGKILL: Killed)" in startup.detail
    assert judge(sandbox.run(scenario())).ok


def test_a_runner_silent_past_every_bound_is_killed_and_reported_as_stuck():
    tight = Timeouts(collective_s=0.2, hang_s=0.5, step_deadline_s=1.0)
    with SandboxedSimWorld(2, tight, margin_s=0.5) as world:
        assert judge(world.run(scenario())).ok
        stopped = world.runner_pid
        os.kill(stopped, signal.SIGSTOP)  # neither dies nor answers
        start = time.monotonic()
        result = judge(world.run(scenario()))
        bound = tight.startup_deadline_s + 3 * tight.collective_s + 10.0 + 0.5
        assert time.monotonic() - start < bound + 2 * 2.0 + 5.0  # the bound, the reap, slack
        startup = next(v for v in result.startup_verdicts if v.checker == "startup")
        assert not startup.ok and "did not finish capture" in startup.detail
        assert "sent nothing for" in result.evidence
        assert wait_gone([stopped]) == []
        assert judge(world.run(scenario())).ok and world.runner_pid != stopped


def test_a_channel_that_stays_silent_times_out_and_one_whose_peer_left_is_closed():
    mine, theirs = socket.socketpair()
    channel = Channel(Connection(os.dup(mine.fileno())))
    mine.close()
    with pytest.raises(TimeoutError) as silent:
        channel.recv(timeout_s=0.05)
    assert not isinstance(silent.value, ChannelClosed)
    theirs.close()
    with pytest.raises(ChannelClosed):
        channel.recv(timeout_s=0.05)
    channel.close()


def test_a_crash_in_capture_fails_start_up_naming_the_crash():
    case = scenario()
    errors = crash_errors(case, None, -11, {0: "all_to_all [258, 19] float64", 1: None}, None)
    history = crashed_history(case, FAST, None, [], -11, {}, None, "")
    verdicts = {v.checker: v for v in check_startup(history.startup, 1.0, case.config)}
    assert not verdicts["startup"].ok
    assert "SIGSEGV: Segmentation fault" in verdicts["startup"].detail
    assert "rank 0 all_to_all [258, 19] float64; rank 1 none yet" in errors[0].message


def test_an_injected_kill_names_its_rank_and_the_others_as_lost_with_it():
    case = scenario([{"kind": "kill_rank", "rank": 0, "step": 1}])
    history = crashed_history(case, FAST, (None, None), [()], -9, {}, None, "")
    records = history.steps[-1]
    assert len(history.steps) == 2 and records[0].step == 1
    assert records[0].error.kind == "RankKilled" and records[0].injected_fault
    assert records[1].error.origin is ErrorOrigin.LOST and not records[1].injected_fault
    assert check_errors(records).ok  # the fault, contained


def test_an_uninjected_crash_fails_the_errors_checker_on_every_rank():
    case = scenario()
    history = crashed_history(case, FAST, (None, None), [], -6, {}, "gloo: boom", "")
    verdict = check_errors(history.steps[0])
    assert not verdict.ok and verdict.detail.startswith("rank 0: RankCrashed")
    assert "(caused by gloo: boom)" in verdict.detail


def test_gloo_s_abort_message_is_read_as_type_and_what():
    assert native_abort_message("noise\n" + GLOO_ABORT) == (
        "gloo::EnforceNotMet: [enforce fail at gloo/transport/tcp/pair.cc:456] "
        "op.preamble.length <= op.nbytes. 1672 vs 456. Received data size doesn't match "
        "expected size. Is there a distributed collective mismatch in your code?")
    assert native_abort_message("Fatal Python error: Aborted\n") is None


def test_the_fuzzer_finds_the_size_mismatched_all_to_all_shrinks_it_and_exits_1(
        capsys, tmp_path):
    code = main(["fuzz", "--variant", "a2a-unpadded-sizes", "--nproc", "2", "--examples", "60",
                 "--shrink-seconds", "60", "--hypothesis-seed", "0", "--json", "--no-database",
                 "--log", str(tmp_path / "log.jsonl"), "--found-dir", str(tmp_path)])
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert code == EXIT_FOUND, out
    assert out["checker"] == "errors" and "RankCrashed" in out["detail"], out["detail"]
    # gloo's failed check aborts the runner; now and then the abort races another thread
    # into a segfault: either is the system's own crash, and gloo's message names the cause.
    assert re.search(r"fatal signal \((SIGABRT|SIGSEGV)", out["detail"]), out["detail"]
    assert "Received data size doesn't match" in out["detail"]
    assert len(out["scenario"]["steps"]) == 1
    assert out["scenario"]["expect"]["reference"] == {"a2a_buffers": "max-tokens"}
    replayed = load_scenario(out["replay"].split("--scenario ")[1].split(" ")[0])
    with SandboxedSimWorld(2, FAST) as world:
        assert "errors" in [v.checker for _, v in judge(world.run(replayed)).failed_verdicts()]
        assert judge(world.run(replayed.with_reference_behaviour())).ok


DRIVER = """
import json, sys, time
from harness.scenario import scenario_from_dict
from harness.timeouts import Timeouts
from harness.world.sandbox import world as sandbox
world = sandbox.SandboxedSimWorld(2, Timeouts(collective_s=2.0, hang_s=4.0,
                                               step_deadline_s=15.0))
world.run(scenario_from_dict({"config": CONFIG, "steps": [{"ranks": [3, 5]}]}))
pids = {"runner": world.runner_pid, "zygote": sandbox._zygote.proc.pid}
if sys.argv[1] == "close":
    pids["leftover"] = world.close()
print(json.dumps(pids), flush=True)
time.sleep(120)
""".replace("CONFIG", repr(SMALL))


def start_driver(mode: str, scratch: Path) -> tuple[subprocess.Popen, dict]:
    # A driver killed outright cannot remove its world's folders: they go in `scratch`.
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, mode], stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": package_pythonpath(),
                                 "TMPDIR": str(scratch)})
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not selector.select(timeout=120):
            proc.kill()
            pytest.fail("the driver did not report its sandbox within 120 s")
        return proc, json.loads(proc.stdout.readline())
    finally:
        selector.close()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < deadline and not all(gone(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if not gone(p)]


def test_closing_the_last_sandboxed_world_leaves_no_process_of_it(tmp_path):
    driver, pids = start_driver("close", tmp_path)
    try:
        assert pids["leftover"] == []
        assert wait_gone([pids["runner"], pids["zygote"]]) == []
    finally:
        driver.kill()
        driver.wait(timeout=10)


def test_no_process_of_the_sandbox_outlives_a_driver_that_was_killed(tmp_path):
    driver, pids = start_driver("keep", tmp_path)
    assert not gone(pids["runner"]) and not gone(pids["zygote"])
    driver.kill()
    driver.wait(timeout=10)
    assert wait_gone([pids["runner"], pids["zygote"]]) == []
