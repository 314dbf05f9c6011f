"""The checker registry: every checker name bound once, every list of names derived from it,
and a check that had nothing to judge reported as "not applicable", never as held."""

from __future__ import annotations

from dataclasses import replace

import pytest
from record_builders import DEADLINE_S, config, reference, startup_records, step_records

from harness.check.registry import REGISTRY, Phase, check_startup, check_step, checkers_of
from harness.check.verdict import Outcome
from harness.errors import ConfigError
from harness.history.records import RecvEvent, VllmExecTrace
from harness.invariants import CheckerName
from harness.scenario import CHECKERS, scenario_from_dict


def outcomes(verdicts) -> dict[str, Outcome]:
    return {v.checker: v.outcome for v in verdicts}


def test_every_checker_name_is_registered_once_with_one_phase():
    names = [c.name for c in REGISTRY]
    assert sorted(names) == sorted(CheckerName) and len(set(names)) == len(names)
    assert set().union(*({c.name for c in checkers_of(phase)} for phase in Phase)) == set(names)
    assert all(checkers_of(phase) for phase in Phase)


def test_a_full_step_gives_one_verdict_per_step_checker_in_registry_order():
    verdicts = check_step(step_records(2), reference(2), DEADLINE_S)
    assert [v.checker for v in verdicts] == [c.name for c in checkers_of(Phase.STEP)]
    assert [v.checker for v in check_startup(startup_records(2), DEADLINE_S, config(2))] == [
        c.name for c in checkers_of(Phase.STARTUP)]


def test_scenario_files_may_name_exactly_the_registered_checkers():
    assert set(CHECKERS) == {str(c.name) for c in REGISTRY}
    base = {"config": {}, "steps": [{"ranks": [{"tokens": 4}, {"tokens": 4}]}]}
    for name in CHECKERS:
        assert scenario_from_dict({**base, "expect": {"caught_by": name}}).caught_by == name
    with pytest.raises(ConfigError, match="^expect.caught_by: names no checker: 'liveliness'"):
        scenario_from_dict({**base, "expect": {"caught_by": "liveliness"}})


def test_a_rank_that_left_no_record_makes_the_record_checkers_not_applicable_naming_it():
    records = [*step_records(3)[:2], None]
    verdicts = {v.checker: v for v in check_step(records, reference(3), DEADLINE_S)}
    assert verdicts["liveness"].outcome is Outcome.FAILED
    assert verdicts["errors"].outcome is Outcome.HELD
    for name in ("agreement", "collective_fingerprints", "matches_reference", "executes_plan"):
        assert verdicts[name].outcome is Outcome.NOT_APPLICABLE, name
        assert verdicts[name].detail == "ranks [2] left no record"
        assert verdicts[name].ok and not verdicts[name].applied


def test_a_fault_makes_the_reference_and_fingerprints_not_applicable_not_held():
    records = step_records(2)
    records[1] = replace(records[1], injected_fault=True)
    got = outcomes(check_step(records, reference(2), DEADLINE_S))
    assert got["collective_fingerprints"] is Outcome.NOT_APPLICABLE
    assert got["matches_reference"] is Outcome.NOT_APPLICABLE
    assert got["routing_provenance"] is Outcome.NOT_APPLICABLE
    assert got["agreement"] is Outcome.HELD


def test_checks_of_what_did_not_run_are_not_applicable():
    got = outcomes(check_step(step_records(2), reference(2), DEADLINE_S))
    # The harness's own execution replayed and decided the step: vLLM's checks, the eager
    # split's and the comparisons with another system had nothing to judge.
    for name in ("ubatching_state", "recv_before_read", "eager_slices", "differential",
                 "differential_base", "spec_decision"):
        assert got[name] is Outcome.NOT_APPLICABLE, name
    assert got["captured_split"] is Outcome.HELD
    eager = [replace(r, executed="eager") for r in step_records(2)]
    assert outcomes(check_step(eager, reference(2), DEADLINE_S))["captured_split"] is (
        Outcome.NOT_APPLICABLE)


def test_vllms_checks_judge_a_step_that_ran_on_vllms_execution():
    trace = VllmExecTrace((), (RecvEvent(0, 0, "hook", "dispatch"),
                               RecvEvent(0, 0, "read", "dispatch")), ())
    records = [replace(r, vllm_exec=trace) for r in step_records(2)]
    got = outcomes(check_step(records, reference(2), DEADLINE_S))
    assert got["ubatching_state"] is Outcome.HELD and got["recv_before_read"] is Outcome.HELD


def test_a_startup_with_a_rank_still_capturing_fails_startup_and_judges_nothing_else():
    records = [*startup_records(2)[:1], None]
    got = outcomes(check_startup(records, DEADLINE_S, config(2)))
    assert got.pop("startup") is Outcome.FAILED
    assert set(got.values()) == {Outcome.NOT_APPLICABLE}
