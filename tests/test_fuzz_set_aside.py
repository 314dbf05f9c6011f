"""A failure that failed once in its five runs, and only by a bound running out, does not end
the search (harness/fuzz/example_verdict.py): a loaded machine, most likely. The search goes
on; a failure that reproduces is the finding, and the one set aside is the finding only when
nothing else turns up. A world that reports a capture timed out on chosen runs stands in for
the loaded machine."""

from __future__ import annotations

from dataclasses import replace

import pytest

import harness.fuzz.command as command
from harness.cli import EXIT_FOUND, main
from harness.errors import ErrorOrigin
from harness.fuzz.engine import FUZZ_TIMEOUTS, Budget, fuzz
from harness.fuzz.example_verdict import first_failure, only_bounds_ran_out
from harness.fuzz.run_log import Intermittency
from harness.fuzz.variants import variant_named
from harness.history.step_error import StepError
from harness.reference_plans import judge_run
from harness.scenario import scenario_from_dict
from harness.world.sim.world import SimWorld

BUDGET = Budget(examples=60, seconds=60, shrink_seconds=5)


def error(origin: ErrorOrigin) -> StepError:
    return StepError("CollectiveTimeout" if origin is ErrorOrigin.TIMEOUT else "RuntimeError",
                     "all_to_all of (8, 16) did not complete", origin=origin)


def capture_timed_out(history):
    """The history of a run whose rank 0 timed out in its capture: no step ran."""
    startup = (replace(history.startup[0], error=error(ErrorOrigin.TIMEOUT)),
               *history.startup[1:])
    return replace(history, startup=startup, steps=())


class SlowStarts:
    """Runs each scenario on the sim world. The first scenario that passes has its capture
    time out on the runs of it numbered in `slow_runs` (from 1)."""

    def __init__(self, world: SimWorld, slow_runs: set[int]) -> None:
        self.world, self.slow_runs = world, slow_runs
        self.slow_key: str | None = None
        self.runs = 0  # runs of the slow scenario

    def run(self, scenario):
        history = self.world.run(scenario)
        if self.slow_key is None and judge_run(history).ok:
            self.slow_key = scenario.to_json()
        if scenario.to_json() != self.slow_key:
            return history
        self.runs += 1
        return capture_timed_out(history) if self.runs in self.slow_runs else history


def search(world: SlowStarts, variant: str, tmp_path):
    return fuzz(variant_named(variant), world.run, world="sim", dp_sizes=(2,),
                fixed={"dp_size": 2}, budget=BUDGET, database=None, seed=1,
                scenario_dir=tmp_path)


def test_a_capture_that_timed_out_once_is_set_aside_and_the_planted_bug_is_still_found(
        tmp_path):
    with SimWorld(2, FUZZ_TIMEOUTS) as sim:
        world = SlowStarts(sim, slow_runs={1})
        outcome = search(world, "guard-merged", tmp_path)
    assert world.runs == 5, "the timed-out run, its rerun and three more"
    assert outcome.found and outcome.checker in variant_named("guard-merged").caught_by
    assert outcome.intermittency is None and "not shrunk" not in outcome.note
    [aside] = outcome.set_aside
    assert aside.to_json() == world.slow_key
    assert outcome.to_json_dict()["set_aside"] == [aside.to_dict()]


def test_a_timeout_set_aside_is_the_finding_when_nothing_that_reproduces_is_found(tmp_path):
    with SimWorld(2, FUZZ_TIMEOUTS) as sim:
        world = SlowStarts(sim, slow_runs={1})
        outcome = search(world, "reference", tmp_path)
    assert outcome.found and outcome.checker == "startup", outcome.note
    assert outcome.intermittency == Intermittency(1, 5)
    assert "nothing that reproduces" in outcome.note and "not shrunk" in outcome.note
    assert outcome.examples_to_detection < outcome.examples
    assert outcome.note.startswith(("examples exhausted", "budget spent")), outcome.note


def test_a_timeout_that_failed_twice_in_five_runs_ends_the_search(tmp_path):
    with SimWorld(2, FUZZ_TIMEOUTS) as sim:
        world = SlowStarts(sim, slow_runs={1, 3})  # passed its rerun, failed the next
        outcome = search(world, "guard-merged", tmp_path)
    assert outcome.found and outcome.checker == "startup"
    assert outcome.intermittency == Intermittency(2, 5) and not outcome.set_aside
    assert outcome.examples == outcome.examples_to_detection, "nothing ran after its reruns"


def test_the_command_prints_the_failures_it_set_aside_and_exits_1_when_they_are_all(
        monkeypatch, capsys, tmp_path):
    searched = command.fuzz

    def slow_once(variant, run, **kwargs):
        world = SlowStarts(type("World", (), {"run": staticmethod(run)})(), slow_runs={1})
        return searched(variant, world.run, **kwargs)

    monkeypatch.setattr(command, "fuzz", slow_once)
    code = main(["fuzz", "--variant", "reference", "--nproc", "2", "--examples", "30",
                 "--hypothesis-seed", "1", "--no-database", "--log", str(tmp_path / "log"),
                 "--found-dir", str(tmp_path / "found")])
    out = capsys.readouterr().out
    assert code == EXIT_FOUND, out
    assert "intermittent (1/5)" in out and "1 one-off failure(s), a bound running out" in out


SCENARIO = scenario_from_dict({
    "name": "two-steps", "config": {"dp_size": 2, "cudagraph_mode": "NONE"},
    "steps": [{"ranks": [{"query_lens": [6]}, {"query_lens": [5]}]}] * 2})


def step_failed_with(history, rank0: StepError | None, rank1: StepError | None | str):
    """The history with its first step's records failed as given ("silent": no record)."""
    first = list(history.steps[0])
    first[0] = replace(first[0], error=rank0)
    first[1] = None if rank1 == "silent" else replace(first[1], error=rank1)
    return replace(history, steps=(tuple(first),))


@pytest.mark.parametrize("rank0, rank1, ran_out", [
    (error(ErrorOrigin.TIMEOUT), error(ErrorOrigin.ABORTED), True),
    (error(ErrorOrigin.HANG), None, True),
    (None, "silent", True),  # a rank that never reported: its deadline ran out
    (error(ErrorOrigin.TIMEOUT), error(ErrorOrigin.RAISED), False),
    (error(ErrorOrigin.TIMEOUT), error(ErrorOrigin.INJECTED), False),
    (error(ErrorOrigin.ABORTED), None, False),  # released, yet no bound ran out
    (error(ErrorOrigin.LOST), None, False),
])
def test_a_failure_is_only_bounds_running_out_when_every_error_is_one_or_its_consequence(
        rank0, rank1, ran_out):
    with SimWorld(2, FUZZ_TIMEOUTS) as sim:
        history = sim.run(SCENARIO)
    result = judge_run(step_failed_with(history, rank0, rank1))
    verdict = first_failure(result)
    assert not verdict.ok and verdict.timed_out is ran_out, verdict


def test_a_wrong_result_beside_a_timeout_is_not_only_bounds_running_out():
    with SimWorld(2, FUZZ_TIMEOUTS) as sim:
        history = sim.run(SCENARIO)
    result = judge_run(capture_timed_out(history))
    assert only_bounds_ran_out(result, "startup")
    assert not only_bounds_ran_out(result, "matches_reference")
