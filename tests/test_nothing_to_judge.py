"""Every green is earned: each registered checker, given a step (a start-up, a run) it has
nothing to judge, never reports held; and given one it does judge, holds. A checker added to
the registry without both cases here fails the first test."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from record_builders import (
    DEADLINE_S,
    config,
    plans,
    reference,
    startup_records,
    step_records,
)

from harness.batch import RankBatch
from harness.check.registry import (
    REGISTRY,
    Checker,
    ScenarioInputs,
    StartupInputs,
    StepInputs,
    check_step,
)
from harness.check.verdict import Outcome
from harness.config import HarnessConfig
from harness.errors import ErrorOrigin
from harness.history.records import RecvEvent, StreamOp, VllmExecTrace
from harness.history.step_error import StepError
from harness.spec.decision import spec_plans
from harness.sut.step_plan import plan_without_world

RANKS = 2
BEFORE_SYNC = StepError("TimeoutError", "the DP all-reduce timed out", None,
                        ErrorOrigin.TIMEOUT)
Inputs = StartupInputs | StepInputs | ScenarioInputs


def step(records, ref=None) -> StepInputs:
    return StepInputs(tuple(records), reference(RANKS) if ref is None else ref, DEADLINE_S)


def startup(records) -> StartupInputs:
    return StartupInputs(tuple(records), DEADLINE_S, config(RANKS))


def undecided():
    """Every rank failed before its DP sync returned: no plan, nothing run."""
    return [replace(r, plan=None, executed="", ran_split=(), replayed=None, error=BEFORE_SYNC,
                    fingerprint=None) for r in step_records(RANKS)]


def eager():
    return [replace(r, executed="eager", replayed=None) for r in step_records(RANKS)]


def with_trace(trace: VllmExecTrace):
    return [replace(r, vllm_exec=trace) for r in step_records(RANKS)]


def compared(**plans_of) -> StepInputs:
    """Every rank's plan beside the plans of another statement of the decision."""
    return step(step_records(RANKS), replace(reference(RANKS), **plans_of))


def undecided_compared(**plans_of) -> StepInputs:
    return step(undecided(), replace(reference(RANKS), **plans_of))


ORDERED = (StreamOp("write", "compute", "x", "experts"), StreamOp("record", "compute", "ev"),
           StreamOp("wait", "comm", "ev"), StreamOp("read", "comm", "x", "all_to_all"))
HOOKED = (RecvEvent("hook", 0, 0, "dispatch"), RecvEvent("read", 0, 0, "dispatch"))
QUERY_LENS = tuple((1,) * (20 + r) for r in range(RANKS))  # step_records' uniform decode


@dataclass(frozen=True)
class Case:
    idle: Inputs  # nothing for the checker to judge: never held
    judged: Inputs  # something to judge, all of it right: held


SOME = step(step_records(RANKS))
STARTUP = startup(startup_records(RANKS))
NO_GRAPHS = startup([replace(r, planned=(), graphs=()) for r in startup_records(RANKS)])


def told_of_a_death() -> StepInputs:
    """Rank 1 has died and rank 0 was told: it replays the 32-token twin over its own column
    where the zero column would have sent it eager (docs/spec.md §1.7)."""
    dead_config = HarnessConfig.of(**{**config(RANKS).to_dict(), "fault_tolerance": True})
    batches = [RankBatch.uniform(20, 1).with_deaths((1,)),
               RankBatch.uniform(0).with_deaths((1,), dead=True)]
    live = tuple(plan_without_world(dead_config, batches))
    keeping = tuple(spec_plans(dead_config, [b.with_deaths((), b.dead) for b in batches]))
    records = [replace(r, plan=p) for r, p in zip(step_records(RANKS), live, strict=True)]
    return step(records, replace(reference(RANKS), spec_plans=live, dead=(1,),
                                 known_dead=(1,), plans_keeping_dead=keeping))

CASES: dict[str, Case] = {
    "startup": Case(startup([None] * RANKS), STARTUP),  # no rank finished capture: failed
    "capture_hygiene": Case(startup([startup_records(RANKS)[0], None]), STARTUP),
    "graphs_capture_work": Case(NO_GRAPHS, STARTUP),
    "capture_symmetry": Case(startup(startup_records(1)), STARTUP),
    "graphs_reachable": Case(NO_GRAPHS, STARTUP),
    "liveness": Case(step([None] * RANKS), SOME),  # no rank reported: failed
    "errors": Case(step([None] * RANKS), SOME),
    "agreement": Case(step(undecided()), SOME),
    "collective_fingerprints": Case(
        step([replace(r, fingerprint=None) for r in step_records(RANKS)]), SOME),
    "captured_split": Case(step(eager()), SOME),
    "no_empty_region": Case(step(undecided()), SOME),
    "matches_reference": Case(step(undecided()), SOME),
    "routing_provenance": Case(step(undecided()), SOME),
    "thread_hygiene": Case(step([step_records(RANKS)[0], None]), SOME),
    "executes_plan": Case(step(undecided()), SOME),
    "eager_slices": Case(SOME, step([replace(r, executed="eager-microbatched", replayed=None)
                                     for r in step_records(RANKS)])),
    "split_consensus": Case(step(undecided()), SOME),
    "dispatch_capacity": Case(
        step([replace(r, a2a_tokens_per_rank=None) for r in step_records(RANKS)]), SOME),
    "fresh_receive": Case(SOME, step([replace(r, run_tag=7, received_tags=((0, 1, 7),))
                                      for r in step_records(RANKS)])),
    "tokens_in_their_requests": Case(
        step(undecided(), replace(reference(RANKS), query_lens=QUERY_LENS)),
        step(step_records(RANKS), replace(reference(RANKS), query_lens=QUERY_LENS))),
    "dead_slots_left_out": Case(SOME, told_of_a_death()),
    "ubatching_state": Case(SOME, step(with_trace(VllmExecTrace((), (), ())))),
    "recv_before_read": Case(step(with_trace(VllmExecTrace((), (), ()))),
                             step(with_trace(VllmExecTrace((), HOOKED, ())))),
    "stream_order": Case(step(with_trace(VllmExecTrace((), HOOKED, ()))),
                         step(with_trace(VllmExecTrace((), (), (), (), ORDERED)))),
    "differential_base": Case(
        undecided_compared(plans=tuple(plans(RANKS)), base_plans=tuple(plans(RANKS))),
        compared(plans=tuple(plans(RANKS)), base_plans=tuple(plans(RANKS)))),
    "differential": Case(undecided_compared(plans=tuple(plans(RANKS))),
                         compared(plans=tuple(plans(RANKS)))),
    "spec_decision": Case(undecided_compared(spec_plans=tuple(plans(RANKS))),
                          compared(spec_plans=tuple(plans(RANKS)))),
    "steps_complete": Case(ScenarioInputs(1, (None,) * RANKS, ()),
                           ScenarioInputs(1, tuple(startup_records(RANKS)),
                                          (tuple(step_records(RANKS)),))),
}


def by_name(checker: Checker) -> str:
    return str(checker.name)


def test_every_registered_checker_has_a_case_with_nothing_to_judge_and_one_it_judges():
    assert set(CASES) == {by_name(c) for c in REGISTRY}


@pytest.mark.parametrize("checker", REGISTRY, ids=by_name)
def test_a_checker_with_nothing_to_judge_never_reports_held(checker):
    verdict = checker.run(CASES[by_name(checker)].idle)
    assert verdict.outcome is not Outcome.HELD, verdict
    if verdict.outcome is Outcome.NOT_APPLICABLE:
        assert verdict.detail, f"{verdict.checker} says not applicable without saying why"
        assert verdict.ok and not verdict.applied


@pytest.mark.parametrize("checker", REGISTRY, ids=by_name)
def test_a_checker_given_something_right_to_judge_holds(checker):
    verdict = checker.run(CASES[by_name(checker)].judged)
    assert verdict.outcome is Outcome.HELD, verdict


def test_no_step_checker_holds_a_step_no_rank_reported():
    verdicts = check_step([None] * RANKS, reference(RANKS), DEADLINE_S)
    assert [v.checker for v in verdicts if v.outcome is Outcome.HELD] == []
    assert {v.checker for v in verdicts if v.outcome is Outcome.FAILED} == {"liveness"}


def checker_named(name: str) -> Checker:
    return next(c for c in REGISTRY if c.name == name)


def test_cross_rank_checkers_do_not_hold_a_comparison_of_one_rank_with_nothing():
    one_known = [step_records(RANKS)[0], replace(step_records(RANKS)[1], fingerprint=None)]
    verdict = checker_named("collective_fingerprints").run(step(one_known))
    assert verdict.outcome is Outcome.NOT_APPLICABLE
    assert "ranks [1] left out" in verdict.detail
    one_decided = [step_records(RANKS)[0], undecided()[1]]
    assert checker_named("split_consensus").run(step(one_decided)).outcome is (
        Outcome.NOT_APPLICABLE)
    alone = StepInputs((step_records(RANKS)[0],), reference(1), DEADLINE_S)
    assert checker_named("agreement").run(alone).outcome is Outcome.NOT_APPLICABLE
