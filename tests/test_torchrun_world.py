"""The torchrun world under faults: every fault ends as a named verdict within its deadline
plus 10 s, no process of the world outlives it, and workers exit when the driver dies."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from process_watch import gone_within
from scenario_width import with_dp_size

from harness.check.judge import judge
from harness.cli import EXIT_BAD_INPUT, main
from harness.errors import ConfigError
from harness.scenario import load_scenario, scenario_from_dict
from harness.timeouts import Timeouts
from harness.world.torchrun.backends import check_backend
from harness.world.torchrun.gpus import pids_holding_gpu_memory
from harness.world.torchrun.world import TorchrunWorld

pytestmark = pytest.mark.dist

ROOT = Path(__file__).resolve().parents[1]
TIMEOUTS = Timeouts(collective_s=2.0, hang_s=4.0, step_deadline_s=8.0)
GRACE_S = 10.0
SMALL = {"capture_sizes": [16, 32], "max_num_reqs": 32, "max_num_batched_tokens": 64,
         "decode_threshold": 8, "prefill_threshold": 16}


@pytest.fixture(scope="module")
def faulty_world(request, nproc):
    """The session's kind of torchrun world (gloo or NCCL, any size) with short bounds."""
    world = TorchrunWorld(nproc, request.config.getoption("--backend"), TIMEOUTS,
                          request.config.getoption("--device"))
    yield world
    assert world.close() == []


def scenario(faults: list, config: dict | None = None, steps: int = 2, nproc: int = 2):
    case = scenario_from_dict({"name": faults[0]["kind"] if faults else "clean",
                               "config": config or SMALL,
                               "steps": [{"ranks": [20, 24]}] * steps, "faults": faults})
    return with_dp_size(case, nproc)


def gpu_memory_used_mib() -> int | None:
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=10).stdout
    return sum(int(v) for v in out.split())


def worker_pids(world: TorchrunWorld) -> list[int]:
    """The rank processes (forked from a zygote on CPU) and torchrun's children."""
    shims = [c.pid for c in psutil.Process(world.agent_pid).children(recursive=True)]
    return [*world.rank_pids.values(), *shims]


def run_and_check_cleanup(world: TorchrunWorld, case):
    if not world.alive:
        world.start()
    pids = worker_pids(world)
    start = time.monotonic()
    result = judge(world.run(case))
    elapsed = time.monotonic() - start
    # The bound is the point (a fault ends within its deadline), kept generous for 2 cores.
    assert elapsed < world.timeouts.step_deadline_s + 5.0 + GRACE_S, f"took {elapsed:.1f} s"
    if not world.alive:  # torn down after the failure: nothing of it may be left
        assert not [p for p in pids if psutil.pid_exists(p)]
        if world.device == "cuda":
            assert pids_holding_gpu_memory(pids) == []
    return result


def verdicts(result) -> dict[str, str]:
    return {v.checker: v.detail for s in result.steps for v in s.verdicts if not v.ok} | {
        v.checker: v.detail for v in result.startup_verdicts if not v.ok}


def test_a_killed_rank_is_named_and_the_world_is_rebuilt(faulty_world):
    launches = faulty_world.launches
    result = run_and_check_cleanup(faulty_world, scenario(
        [{"kind": "kill_rank", "rank": 1, "step": 1}], nproc=faulty_world.nproc))
    assert "rank 1 was killed" in result.evidence
    killed = result.steps[1].records[1]
    assert killed.error.kind == "RankKilled"
    assert result.steps[0].ok  # the step before the kill held
    errors = next(v for v in result.steps[1].verdicts if v.checker == "errors")
    assert errors.ok and "rank 1 RankKilled" in errors.detail
    assert run_and_check_cleanup(faulty_world, scenario([], nproc=faulty_world.nproc)).ok
    assert faulty_world.launches > launches


def test_a_failure_every_rank_survives_forms_a_fresh_group_in_the_same_processes(
        faulty_world):
    if faulty_world.backend != "gloo":
        pytest.skip("an NCCL communicator is not re-formed in place: that world relaunches")
    assert run_and_check_cleanup(faulty_world, scenario([], nproc=faulty_world.nproc)).ok
    pids, launches = dict(faulty_world.rank_pids), faulty_world.launches
    regroups = faulty_world.regroups
    clocked = (len(faulty_world.clock.starts), len(faulty_world.clock.regroups))
    config = dict(SMALL, cudagraph_mode="NONE", all2all_backend="deepep_high_throughput")
    result = run_and_check_cleanup(faulty_world, scenario(
        [{"kind": "raise_in_ubatch", "rank": 0, "step": 0}], config, nproc=faulty_world.nproc))
    assert result.steps[0].records[0].error.kind == "MicrobatchFailed"
    assert "formed a fresh group" in result.evidence and "--- rank 1 stacks ---" in result.evidence
    assert (faulty_world.launches, faulty_world.regroups) == (launches, regroups + 1)
    # The clock saw one regroup and no launch (how long it took is make bench's row).
    assert (len(faulty_world.clock.starts), len(faulty_world.clock.regroups)) == (
        clocked[0], clocked[1] + 1)
    # The fresh group carries the next scenario's collectives, in the same processes.
    assert run_and_check_cleanup(faulty_world, scenario([], nproc=faulty_world.nproc)).ok
    assert faulty_world.rank_pids == pids


def test_a_rank_that_aborts_is_named_with_its_signal_and_last_collective(faulty_world):
    launches = faulty_world.launches
    result = run_and_check_cleanup(faulty_world, scenario(
        [{"kind": "abort_rank", "rank": 1, "step": 1}], nproc=faulty_world.nproc))
    crashed = result.steps[1].records[1]
    assert crashed.error.kind == "RankCrashed", crashed.error
    assert crashed.error.message == ("died of a fatal signal (Aborted); its last collective: "
                                     f"all_reduce [7, {faulty_world.nproc}] int32")
    assert result.steps[0].ok  # the step before the abort held
    errors = next(v for v in result.steps[1].verdicts if v.checker == "errors")
    assert errors.ok and "rank 1 RankCrashed" in errors.detail
    assert run_and_check_cleanup(faulty_world, scenario([], nproc=faulty_world.nproc)).ok
    assert faulty_world.launches > launches


def test_a_size_mismatched_all_to_all_is_named_by_the_rank_gloo_aborted(faulty_world):
    if faulty_world.backend != "gloo":
        pytest.skip("gloo's size check aborts the rank; NCCL compares no sizes")
    planted = with_dp_size(load_scenario(ROOT / "scenarios" / "a2a-unpadded-sizes.json"),
                           faulty_world.nproc)
    result = run_and_check_cleanup(faulty_world, planted)
    assert result.steps[0].ok  # the replayed step keeps its captured sizes
    # The idle rank 0 holds 2 rows a peer and receives its peers' 10: it is the one aborted.
    crashed = result.steps[1].records[0]
    assert crashed.error.kind == "RankCrashed", crashed.error
    assert crashed.error.message == ("died of a fatal signal (Aborted); its last collective: "
                                     f"all_to_all [{3 * faulty_world.nproc}, 19] float64")
    assert "Received data size doesn't match expected size" in crashed.error.cause
    errors = next(v for v in result.steps[1].verdicts if v.checker == "errors")
    assert not errors.ok and errors.detail.startswith("rank 0: RankCrashed"), errors.detail
    assert run_and_check_cleanup(faulty_world, planted.with_reference_behaviour()).ok


def test_a_rank_that_skips_the_sync_leaves_its_peer_timing_out_not_hanging(faulty_world):
    result = run_and_check_cleanup(faulty_world, scenario(
        [{"kind": "skip_sync", "rank": 1, "step": 0}], nproc=faulty_world.nproc))
    records = result.steps[0].records
    assert records[1].error.kind == "InjectedFault"
    assert "CollectiveTimeout" in records[0].error.describe()
    assert [s.ok for s in result.steps] == [True]
    # The ranks form a fresh group after it (or relaunch), and show their stacks first.
    assert all(f"--- rank {r} stacks ---" in result.evidence for r in range(faulty_world.nproc))


def test_a_rank_slower_than_the_deadline_is_reported_as_a_hang_with_stacks(faulty_world):
    result = run_and_check_cleanup(faulty_world, scenario(
        [{"kind": "slow_rank", "rank": 0, "step": 0, "seconds": 60}], nproc=faulty_world.nproc))
    assert verdicts(result)["liveness"].startswith("ranks [0] still running")
    assert "ranks [0] missed their deadline at step 0" in result.evidence
    assert "rank 1 trace tail: -- step 0 | #" in result.evidence  # rank 1 waits in the sync
    assert "--- rank 0 stacks ---" in result.evidence and "rank_runtime.py" in result.evidence


def test_a_stock_microbatch_failure_is_a_named_hang_and_abortable_names_the_microbatch(
        faulty_world):
    config = dict(SMALL, cudagraph_mode="NONE", all2all_backend="deepep_high_throughput")
    fault = [{"kind": "raise_in_ubatch", "rank": 0, "step": 0}]
    stock = run_and_check_cleanup(faulty_world, scenario(
        fault, dict(config, protocol="stock"), nproc=faulty_world.nproc))
    assert verdicts(stock)["liveness"].startswith("rank 0 hung: MicrobatchHang")
    assert "--- rank 1 stacks ---" in stock.evidence
    abortable = run_and_check_cleanup(faulty_world, scenario(
        fault, config, nproc=faulty_world.nproc))
    assert abortable.ok, (verdicts(abortable), abortable.evidence)
    assert abortable.steps[0].records[0].error.describe().startswith(
        "MicrobatchFailed: Microbatch 0 of 2 failed")


def test_a_microbatch_fault_on_one_rank_is_named_there_and_times_out_its_peers(faulty_world):
    # Found by the fuzzer on the reference over NCCL, where it read as a hang: the peer's
    # all-to-all only fails once its communicator is aborted, after the hang timeout.
    n = faulty_world.nproc
    case = scenario_from_dict({
        "name": "fault-in-one-rank", "config": {
            "dp_size": n, "capture_sizes": [8], "decode_threshold": 2, "prefill_threshold": 4,
            "max_num_reqs": 8, "max_num_batched_tokens": 16},
        "steps": [{"ranks": [{"tokens": 4}] + [{"query_lens": [1, 1, 1, 1, 2, 2]}] * (n - 1)}],
        "faults": [{"kind": "raise_in_ubatch", "rank": 1, "step": 0, "ubatch": 1}]})
    result = run_and_check_cleanup(faulty_world, case)
    assert result.ok, (verdicts(result), result.evidence)
    records = result.steps[0].records
    assert records[1].error.describe().startswith("MicrobatchFailed: Microbatch 1 of 2 failed")
    assert "CollectiveTimeout" in records[0].error.describe()


def test_rank_asymmetric_candidates_fail_capture_with_a_named_verdict(faulty_world):
    config = dict(SMALL, threshold_offset_rank=1, threshold_offset=16)
    result = run_and_check_cleanup(faulty_world, scenario([], config, nproc=faulty_world.nproc))
    found = verdicts(result)
    assert "capture_symmetry" in found, (found, result.evidence, result.startup)
    assert found["capture_symmetry"].startswith("ranks [1] plan other graphs")
    assert result.steps == ()


_DRIVER = """
import sys, time
from harness.world.torchrun.world import TorchrunWorld
world = TorchrunWorld(2)
world.start()
import psutil
workers = [c.pid for c in psutil.Process(world.agent_pid).children(recursive=True)]
ranks = [*world.rank_pids.values(), world.rig.zygote_pid]
print(" ".join(map(str, [world.agent_pid, *workers, *ranks])), flush=True)
time.sleep(600)
"""


def test_workers_and_torchrun_exit_by_themselves_when_the_driver_is_killed(tmp_path):
    # A driver killed outright cannot remove its world's folders: they go in tmp_path.
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, start_new_session=True,
                              env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        line = driver.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 6, line  # torchrun, two shims, two ranks, their zygote
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=10)
        assert gone_within(pids, 15) == []
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)


def test_nccl_without_a_gpu_is_one_line_and_exit_2(capsys, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: nccl can run here")
    with pytest.raises(ConfigError) as error:
        check_backend("nccl", 2)
    assert error.value.field == "backend"
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"config": SMALL, "steps": [{"ranks": [20, 24]}]}))
    assert main(["run", "--scenario", str(path), "--world", "torchrun",
                 "--backend", "nccl"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: backend: nccl needs a GPU")


def test_the_distributed_suite_asked_for_nccl_without_a_gpu_fails_in_one_line_not_skips():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: nccl can run here")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "dist", "--world",
                           "torchrun", "--backend", "nccl", "-p", "no:cacheprovider",
                           "tests/test_distributed_suite.py"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert lines == ["ERROR: backend: nccl needs a GPU and none is visible here; use "
                     "BACKEND=gloo (or --backend gloo)"]
