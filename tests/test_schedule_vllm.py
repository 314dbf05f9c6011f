"""vLLM's own ubatching.py under controlled schedules (`--exec vllm`, docs/schedules.md):
routed only for a controlled step and put back after; a handoff race planted in a test-only
copy (tests/data/vllm/restore-before-wait.diff) fails under its pct seed every time, with the
same choices, where the unpatched code holds; vLLM's sibling-failure hang comes back at once
as a liveness failure naming the parked threads, without relaunching the world; the fuzzer
finds the race from nothing and its saved scenario replays it. Ranks are torchrun processes
over gloo (vLLM's ubatching state is per process). Skipped where vLLM does not import."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from vllm_releases import on_installed

from harness.fuzz.engine import FUZZ_TIMEOUTS, Budget, fuzz
from harness.fuzz.schedules import ScheduleSpace
from harness.fuzz.variants import EXEC_VARIANTS
from harness.reference_plans import judge_run
from harness.runtime.schedule import OS_SCHEDULE, Schedule
from harness.runtime.schedule.primitives import ControlledBarrier, ControlledThread
from harness.scenario import load_scenario, scenario_from_dict
from harness.timeouts import Timeouts
from harness.vllm_code.source import VllmPatch, content_hash
from harness.vllm_sut.available import installed_release, unavailable_reason, vllm_version
from harness.world.pool import WorldPool
from harness.world.torchrun.world import TorchrunWorld

if vllm_version() is None:
    pytest.skip(unavailable_reason(), allow_module_level=True)

ROOT = Path(__file__).resolve().parent
RACE = ROOT / "data" / "vllm" / "restore-before-wait.diff"
HANG = ROOT.parent / "scenarios" / "vllm" / "exec" / "sibling-failure-hang.json"
TIMEOUTS = Timeouts(collective_s=2.0, hang_s=4.0, step_deadline_s=10.0)
DATA = {"config": {"execution": "vllm", "sut": "vllm", "cudagraph_mode": "NONE",
                   "max_num_reqs": 16, "max_num_batched_tokens": 32, "decode_threshold": 4,
                   "prefill_threshold": 16},
        "steps": [{"ranks": [{"tokens": 10}, {"tokens": 12}]},
                  {"ranks": [{"tokens": 6}, {"tokens": 8}]}]}
# Seeds of pct that open the race's window on this scenario (2 of seeds 0-19, 2026-12).
RACE_SEEDS = (15, 18)


def race_patch() -> VllmPatch:
    text = RACE.read_text()
    return VllmPatch(RACE.name, content_hash(text), text)


def scenario(schedule: Schedule, patched: bool):
    base = on_installed(scenario_from_dict(DATA))
    config = base.config.with_changes(vllm_patches=(race_patch(),) if patched else ())
    return replace(base, config=config, schedule=schedule)


@pytest.fixture(scope="module")
def world():
    with TorchrunWorld(2, "gloo", timeouts=TIMEOUTS) as w:
        yield w


def judged(world, case):
    """(failed checkers and their details, every record's choices) of one run."""
    result = judge_run(world.run(case))
    failed = {v.checker: v.detail for _, v in result.failed_verdicts()}
    return failed, [r.schedule_choices for step in result.steps for r in step.records]


def test_vllms_threading_is_routed_only_during_a_controlled_step_and_put_back_after():
    from harness.vllm_exec.scheduling import VllmScheduling
    from harness.vllm_sut.code import vllm_code

    code = vllm_code(scenario(OS_SCHEDULE, patched=False).config)
    u, runner_module = code.ubatching, code.runner_module
    runner = SimpleNamespace(num_ubatches=2, ready_barrier=threading.Barrier(3))
    before = (u.threading, runner_module.threading, runner.ready_barrier,
              vars(u.UBatchContext)["update_stream"], u.dbo_register_recv_hook)
    scheduling = VllmScheduling(u, runner_module, runner, 5.0, 0)

    def now():
        return (u.threading, runner_module.threading, runner.ready_barrier,
                vars(u.UBatchContext)["update_stream"], u.dbo_register_recv_hook)

    with scheduling.step(OS_SCHEDULE):
        assert now() == before
    with scheduling.step(Schedule("pct", seed=1)):
        routed = now()
        assert all(r is not b for r, b in zip(routed, before, strict=True))
        assert isinstance(runner.ready_barrier, ControlledBarrier)
        assert u.threading.get_ident is threading.get_ident
        thread = u.threading.Thread(target=lambda ctx: None, args=(SimpleNamespace(id=1),))
        assert isinstance(thread, ControlledThread) and thread.name == "ubatch-1 (<lambda>)"
    assert now() == before


@pytest.mark.parametrize("seed", RACE_SEEDS)
def test_the_planted_race_fails_under_its_pct_seed_ten_times_of_ten_with_the_same_choices(
        world, seed):
    runs = [judged(world, scenario(Schedule("pct", seed=seed), patched=True))
            for _ in range(10)]
    failed, choices = runs[0]
    assert failed and all(c for c in choices), failed
    assert all(run == runs[0] for run in runs)


@pytest.mark.parametrize("schedule", [*(Schedule("pct", seed=s) for s in RACE_SEEDS),
                                      *(Schedule("random", seed=s) for s in range(3))])
def test_unpatched_vllm_holds_under_the_schedules_that_open_the_race(world, schedule):
    failed, choices = judged(world, scenario(schedule, patched=False))
    assert not failed and all(c for c in choices), failed


def test_under_os_vllm_runs_on_real_threads_and_records_no_choice(world):
    failed, choices = judged(world, scenario(OS_SCHEDULE, patched=False))
    assert not failed and choices == [None] * 4


def test_vllms_sibling_failure_hang_is_a_liveness_failure_naming_its_threads_at_once(world):
    judged(world, scenario(OS_SCHEDULE, patched=False))  # the world is up
    launches = world.launches
    case = replace(on_installed(load_scenario(HANG)), schedule=Schedule("pct", seed=0))
    failed, _ = judged(world, case)
    detail = failed["liveness"]
    assert detail.startswith("rank 0 hung: ScheduleDeadlockError: deadlock under schedule pct")
    assert "'ubatch-1 (run_ubatch)' blocked in cpu_event[1].wait at " \
           "vllm/v1/worker/ubatching.py:" in detail and "(_cpu_yield)" in detail
    assert "thread 0 'rank 0' blocked in join ubatch-1 (run_ubatch)" in detail
    assert world.launches == launches  # no rank hung: nothing was relaunched


@pytest.mark.slow
@pytest.mark.timeout(540)
def test_the_fuzzer_finds_the_planted_race_under_pct_and_its_scenario_replays_it(tmp_path):
    variant = EXEC_VARIANTS["vllm-exec"]
    fixed = {"release": installed_release().value, "vllm_patches": (race_patch(),)}
    with WorldPool("torchrun", "gloo", FUZZ_TIMEOUTS, 2, preload_vllm=True) as pool:
        outcome = fuzz(variant, pool.run, world="torchrun", dp_sizes=(2,), fixed=fixed,
                       budget=Budget(seconds=240.0, shrink_examples=30), database=None,
                       scenario_dir=tmp_path, seed=0,
                       schedules=ScheduleSpace(Schedule("pct"), draws_seed=True))
        assert outcome.found and outcome.intermittency is None, outcome.note
        # The race's signs: its deadlock, or the crash of the microbatch that ran on its
        # sibling's forward context.
        assert outcome.checker in ("liveness", "errors"), outcome.detail
        saved = json.loads(next(tmp_path.glob("*.json")).read_text())
        assert saved["schedule"]["mode"] == "pct"
        config = {**saved["config"], "vllm_patches": [race_patch().to_dict()]}
        replayed = scenario_from_dict({**saved, "config": config})
        verdicts = [judge_run(pool.run(replayed)) for _ in range(10)]
        unpatched = scenario_from_dict({**saved, "config": {**config, "vllm_patches": []}})
        assert judge_run(pool.run(unpatched)).ok  # the patch is what fails
    assert all(outcome.checker in {v.checker for _, v in r.failed_verdicts()}
               for r in verdicts)
