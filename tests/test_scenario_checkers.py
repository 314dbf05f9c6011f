"""Checkers of the scenario phase: run once over every step's records, they see what no step
checker can, a step missing from the history or a record out of its place."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import record_builders as rb

from harness.check.history_file import SavedRun, save_run
from harness.check.reference import reference_rows
from harness.check.registry import Phase, check_scenario, checkers_of
from harness.check.verdict import Outcome
from harness.cli import EXIT_FOUND, EXIT_OK, main
from harness.history.step_error import StepError
from harness.scenario import scenario_from_dict
from harness.timeouts import Timeouts
from harness.world.sim.world import SimWorld


def steps(count: int, ranks: int = 2) -> list[list]:
    """`count` clean steps, each record carrying its step and rank."""
    return [[replace(r, step=i) for r in rb.step_records(ranks)] for i in range(count)]


def steps_complete(planned: int, history: list[list], startup=None):
    startup = rb.startup_records(2) if startup is None else startup
    [verdict] = [v for v in check_scenario(planned, startup, history)
                 if v.checker == "steps_complete"]
    return verdict


def failed_step(records: list) -> list:
    error = StepError("InjectedFault", "boom")
    return [replace(records[0], error=error, injected_fault=True), *records[1:]]


def test_the_scenario_phase_runs_its_checkers_once_over_the_whole_run():
    names = [c.name for c in checkers_of(Phase.SCENARIO)]
    assert "steps_complete" in names
    assert [v.checker for v in check_scenario(3, rb.startup_records(2), steps(3))] == names


def test_every_planned_step_on_every_rank_holds():
    verdict = steps_complete(3, steps(3))
    assert verdict.outcome is Outcome.HELD and verdict.detail == "all 3 steps on every rank"


def test_a_run_that_stopped_right_after_a_failed_step_holds_naming_where():
    history = steps(2)
    history[1] = failed_step(history[1])
    verdict = steps_complete(4, history)
    assert verdict.outcome is Outcome.HELD
    assert verdict.detail == "stopped after step 1 of 4, which failed"


def test_a_history_cut_short_with_no_failed_step_fails_naming_the_count():
    verdict = steps_complete(3, steps(2))
    assert verdict.outcome is Outcome.FAILED
    assert verdict.detail.startswith("only 2 of the scenario's 3 steps ran, and none failed")


def test_steps_run_on_past_a_failed_one_fail():
    history = steps(3)
    history[0] = failed_step(history[0])
    verdict = steps_complete(3, history)
    assert verdict.outcome is Outcome.FAILED and verdict.detail.startswith("step 0 failed")


def test_a_record_out_of_its_place_fails_naming_the_slot_and_what_it_holds():
    history = steps(2)
    history[1] = list(reversed(history[1]))
    assert steps_complete(2, history).detail == "step 1, rank 0: holds rank 1's record of step 1"
    history = steps(2)
    history[1] = [replace(r, step=0) for r in history[1]]
    assert steps_complete(2, history).outcome is Outcome.FAILED


def test_a_capture_that_barred_every_step_is_not_applicable_not_held():
    startup = [replace(rb.startup_records(2)[0], pending_run=True), None]
    verdict = steps_complete(3, [], startup)
    assert verdict.outcome is Outcome.NOT_APPLICABLE and verdict.ok and not verdict.applied


SMALL = {"capture_sizes": [16, 32], "max_num_reqs": 32, "max_num_batched_tokens": 64,
         "decode_threshold": 8, "prefill_threshold": 16}
CLEAN = {"name": "clean", "config": SMALL,
         "steps": [{"ranks": [20, 24]}, {"ranks": [3, 5]}, {"ranks": [9, 9]}]}
FAST = Timeouts(collective_s=2.0, hang_s=4.0, step_deadline_s=15.0)


def test_a_saved_run_with_a_step_cut_from_it_fails_steps_complete_and_only_it(capsys,
                                                                              tmp_path: Path):
    scenario = scenario_from_dict(CLEAN)
    with SimWorld(2, FAST) as world:
        history = world.run(scenario)
    saved = tmp_path / "out.json"
    save_run(saved, SavedRun(history, tuple(reference_rows(scenario))))
    assert main(["check", "--history", str(saved)]) == EXIT_OK
    capsys.readouterr()
    data = json.loads(saved.read_text())
    data["steps"].pop()
    saved.write_text(json.dumps(data))
    assert main(["check", "--history", str(saved), "--json"]) == EXIT_FOUND
    out = json.loads(capsys.readouterr().out)
    whole = {v["checker"]: v for v in out["scenario_verdicts"]}
    assert whole["steps_complete"]["outcome"] == "failed"
    failed = [v["checker"] for phase in (out["startup"], *(s["verdicts"] for s in out["steps"]),
                                         out["scenario_verdicts"]) for v in phase if not v["ok"]]
    assert failed == ["steps_complete"]
    assert main(["check", "--history", str(saved)]) == EXIT_FOUND
    text = capsys.readouterr().out
    assert "scenario (every step):\n  FAIL steps_complete: only 2 of the scenario's 3" in text
