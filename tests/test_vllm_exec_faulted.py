"""A faulted example of vLLM's execution code costs what its verdict needs: the hang is named
when the parked rank says its step outlived the step deadline (not after the driver's
slack), and the example after it runs at once on a spare whose ranks imported vLLM while the
world ran, instead of a relaunch that imports it again. Skipped where vLLM does not import."""

from __future__ import annotations

import dataclasses
import time

import psutil
import pytest

from harness.fuzz.engine import FUZZ_TIMEOUTS
from harness.vllm_sut.available import unavailable_reason, vllm_version
from harness.world.torchrun.world import TorchrunWorld

if vllm_version() is None:
    pytest.skip(unavailable_reason(), allow_module_level=True)

from harness.bench.exec_costs import hang_example  # noqa: E402 - it imports vLLM's configs
from harness.reference_plans import judge_run  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm-exec-faulted")]


@pytest.fixture(scope="module")
def seen() -> dict:
    """One world's life: start, a clean run of the hang's config, the hang, a clean run."""
    hang = hang_example()
    clean = dataclasses.replace(hang, faults=())
    noted: dict = {}
    world = TorchrunWorld(2, "gloo", FUZZ_TIMEOUTS, preload_vllm=True)
    pids: list[int] = []
    try:
        world.start()
        spare = world.rig.spare
        noted["spare booted at start"] = spare is not None and "--preload-vllm" in spare.proc.args
        assert judge_run(world.run(clean)).ok  # the config captured: the hang's run is its step
        asked: list[float] = []
        evidence = world.rig.rank_evidence
        world.rig.rank_evidence = lambda *a: asked.append(time.monotonic()) or evidence(*a)
        began = time.monotonic()
        result = judge_run(world.run(hang))
        world.rig.rank_evidence = evidence
        noted["hang named after"] = asked[0] - began if asked else None
        noted["failed"] = {v.checker for _, v in result.failed_verdicts()}
        assert judge_run(world.run(clean)).ok
        noted["ran on the spare"] = spare is not None and world.agent_pid == spare.proc.pid
        pids = [world.agent_pid, *world.rank_pids.values()]
    finally:
        noted["left alive"] = world.close()
    noted["still running"] = [p for p in pids if psutil.pid_exists(p)
                              and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    return noted


def test_a_vllm_world_boots_a_spare_with_vllm_imported_before_any_failure(seen):
    assert seen["spare booted at start"]


def test_a_vllm_hang_is_named_at_the_step_deadline_not_after_the_drivers_slack(seen):
    assert "liveness" in seen["failed"]
    named = seen["hang named after"]
    # The parked rank says so at the step deadline; the driver alone would wait its slack.
    assert named is not None and FUZZ_TIMEOUTS.overdue_s <= named < FUZZ_TIMEOUTS.step_wait_s


def test_the_example_after_a_hang_runs_on_the_spare_not_a_relaunch(seen):
    assert seen["ran on the spare"]


def test_no_process_of_the_world_or_its_spares_outlives_it(seen):
    assert seen["left alive"] == [] and seen["still running"] == []
