"""Verdicts the search knows without a world run (harness/fuzz/known_verdicts.py): a run that
stopped at a failed step stands for every redraw of its unrun steps, and in a hunt a faulted
run that failed only outside it stands for every scenario with that config and fault; under
vLLM's execution each rerun would cost a hang's deadline and a relaunch."""

from __future__ import annotations

from dataclasses import replace

import pytest

import harness.fuzz.search_state as search_state
from harness.batch import RankBatch
from harness.check.judge import ScenarioResult, StepResult
from harness.check.verdict import Outcome, Verdict
from harness.config import HarnessConfig
from harness.faults import Fault, FaultKind
from harness.fuzz.engine import FUZZ_TIMEOUTS, Budget
from harness.fuzz.example_verdict import first_failure
from harness.fuzz.known_verdicts import KnownVerdicts, stopped_after
from harness.fuzz.variants import VARIANTS
from harness.reference_plans import judge_run
from harness.scenario import Scenario
from harness.world.sim.world import SimWorld

# Eager configs: a split step runs its microbatch threads, where the fault fires.
CONFIG = HarnessConfig.of(dp_size=2, cudagraph_mode="NONE", capture_sizes=(), max_num_reqs=16,
                          max_num_batched_tokens=16, decode_threshold=2, prefill_threshold=4)
SPLIT = tuple(RankBatch.from_query_lens((1,) * n) for n in (6, 8))
SMALL = tuple(RankBatch.from_query_lens((1,) * n) for n in (1, 2))
OTHER = tuple(RankBatch.from_query_lens((1,) * n) for n in (3, 5))
FAULT = (Fault(FaultKind.RAISE_IN_UBATCH, 1, 0),)  # fails step 0: the world runs no more
STOPPED = Scenario(CONFIG, (SPLIT, SMALL), FAULT)
REDRAWN = Scenario(CONFIG, (SPLIT, OTHER), FAULT)  # only the unrun step differs
OTHER_FIRST = Scenario(CONFIG, (OTHER, SMALL), FAULT)  # a step that ran differs


@pytest.fixture(scope="module")
def world():
    with SimWorld(2, FUZZ_TIMEOUTS) as opened:
        yield opened


def test_a_run_that_stopped_at_a_failed_step_stands_for_scenarios_sharing_what_ran(world):
    result = judge_run(world.run(STOPPED))
    assert stopped_after(result) == 1
    known = KnownVerdicts()
    verdict = first_failure(result)
    known.add(STOPPED, result, verdict)
    assert known.verdict_of(REDRAWN) == verdict == first_failure(judge_run(world.run(REDRAWN)))
    assert known.verdict_of(Scenario(CONFIG, (SPLIT,), FAULT)) == verdict
    # What ran differs: the fault, the first step, the config.
    assert known.verdict_of(Scenario(CONFIG, (SPLIT, SMALL), ())) is None
    assert known.verdict_of(OTHER_FIRST) is None
    other_config = replace(CONFIG, serving=replace(CONFIG.serving, max_num_reqs=32))
    assert known.verdict_of(Scenario(other_config, (SPLIT, SMALL), FAULT)) is None


def test_a_forgotten_run_stands_for_nothing_it_stood_for():
    # The search forgets a failure its reruns did not reproduce (a bound that ran out once).
    known = KnownVerdicts()
    known.add(STOPPED, _hung(STOPPED), first_failure(_hung(STOPPED)))
    known.add(OTHER_FIRST, _hung(OTHER_FIRST), first_failure(_hung(OTHER_FIRST)))
    known.forget(STOPPED)
    assert known.verdict_of(REDRAWN) is None
    assert known.verdict_of(OTHER_FIRST) is not None  # only what the forgotten run kept


def test_a_run_that_did_not_stop_at_a_failure_is_not_kept(world):
    result = judge_run(world.run(Scenario(CONFIG, (SPLIT, SMALL), ())))
    assert len(result.steps) == 2 and stopped_after(result) is None
    known = KnownVerdicts()
    known.add(STOPPED, result, first_failure(result))
    assert known.verdict_of(REDRAWN) is None


def _hung(scenario: Scenario) -> ScenarioResult:
    """A run that hung at its first step: liveness failed there."""
    hang = Verdict("liveness", Outcome.FAILED, "a rank missed its deadline")
    return ScenarioResult(scenario, (None, None), (), (StepResult((None, None), (hang,)),))


def test_in_a_hunt_a_fault_that_failed_outside_it_is_not_run_again_in_that_config():
    known = KnownVerdicts()
    hunted = first_failure(_hung(STOPPED), only=("errors",))
    assert hunted.ok  # the hang is not what this hunt counts
    known.add(STOPPED, _hung(STOPPED), hunted)
    assert known.verdict_of(OTHER_FIRST) == hunted  # the same fault, other batches
    assert known.verdict_of(Scenario(CONFIG, (OTHER,), ())) is None  # no fault
    other_fault = (Fault(FaultKind.RAISE_IN_UBATCH, 0, 0),)
    assert known.verdict_of(Scenario(CONFIG, (OTHER,), other_fault)) is None
    # A hang the search hunts for is a finding, not a verdict handed out again.
    found = KnownVerdicts()
    found.add(STOPPED, _hung(STOPPED), first_failure(_hung(STOPPED), only=("liveness",)))
    assert found.verdict_of(OTHER_FIRST) is None


def test_a_fault_free_run_that_failed_outside_the_hunt_stands_only_for_itself():
    clean = Scenario(CONFIG, (SPLIT, SMALL), ())
    known = KnownVerdicts()
    known.add(clean, _hung(clean), first_failure(_hung(clean), only=("errors",)))
    assert known.verdict_of(Scenario(CONFIG, (OTHER, SMALL), ())) is None


def test_the_search_runs_neither_a_redraw_of_unrun_steps_nor_a_fault_its_hunt_left_out(
        world, monkeypatch):
    ran = []

    def run(scenario):
        ran.append(scenario)
        return world.run(scenario)

    search = search_state.Search(run, VARIANTS["reference"], "sim", Budget(seconds=None),
                                 None, None)
    first = search.verdict(STOPPED)
    assert search.verdict(REDRAWN) == first and ran == [STOPPED]
    search.verdict(OTHER_FIRST)  # the reference contains the fault: nothing failed
    assert len(ran) == 2 and search.examples == 2
    # A hunt for crashes, where every faulted run hangs.
    monkeypatch.setattr(search_state, "judge_run", lambda history: _hung(history.scenario))
    hunt = search_state.Search(run, VARIANTS["reference"], "sim", Budget(seconds=None), None,
                               None, hunt=("errors",))
    assert hunt.verdict(STOPPED).ok and hunt.verdict(OTHER_FIRST).ok
    assert hunt.examples == 1 and hunt.known.reused == 1
