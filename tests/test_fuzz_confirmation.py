"""A failure is believed only once it fails again (harness/fuzz/engine.py): the first one the
search finds is rerun at once, the shrunk one at the end; the shrink steps between are run
once each. A first failure that passes its rerun is an intermittent finding: run a few more
times, reported with how many runs failed, saved, never shrunk. A world that fails a
scenario only on some runs stands in for a race or a hang: those runs of a scenario run the
undone scenario, which passes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis.errors import FlakyFailure

import harness.fuzz.command as command
import harness.fuzz.engine as engine
from harness.cli import EXIT_FOUND, main
from harness.fuzz.engine import FUZZ_TIMEOUTS, Budget, fuzz
from harness.fuzz.run_log import FindingEntry, Intermittency, read_log
from harness.fuzz.variants import variant_named
from harness.scenario import load_scenario
from harness.world.sim.world import SimWorld

VARIANT, FIXED = variant_named("guard-merged"), {"dp_size": 2}
BUDGET = Budget(examples=80, seconds=60, shrink_seconds=5)


class CountingWorld:
    """Runs each scenario on the sim world; `passes_again(nth, scenario)` says whether the
    nth run (from 1) of that scenario runs its undone twin instead."""

    def __init__(self, world: SimWorld, passes_again) -> None:
        self.world, self.passes_again = world, passes_again
        self.seen: dict[str, tuple[int, object]] = {}  # runs and the scenario, by its JSON

    def run(self, scenario):
        key = scenario.to_json()
        nth = self.seen.get(key, (0, None))[0] + 1
        self.seen[key] = (nth, scenario)
        if self.passes_again(nth, scenario):
            undone = replace(scenario, reference_changes=VARIANT.undo)
            return self.world.run(undone.with_reference_behaviour())
        return self.world.run(scenario)


def search(world: CountingWorld, tmp_path, log_path=None):
    return fuzz(VARIANT, world.run, world="sim", dp_sizes=(2,), fixed=FIXED, budget=BUDGET,
                database=None, seed=1, scenario_dir=tmp_path, log_path=log_path)


def same_case(a, b) -> bool:
    return (a.config, a.steps, a.faults) == (b.config, b.steps, b.faults)


@pytest.mark.parametrize("passes_again, failed", [
    (lambda nth: nth >= 2, 1),  # failed once, then never again
    (lambda nth: nth == 2, 4),  # passed its rerun only
])
def test_a_failure_that_passes_on_its_rerun_is_an_intermittent_finding_left_unshrunk(
        tmp_path, passes_again, failed):
    with SimWorld(2, FUZZ_TIMEOUTS) as sim:
        world = CountingWorld(sim, lambda nth, _: passes_again(nth))
        outcome = search(world, tmp_path / "found", tmp_path / "log.jsonl")
    assert outcome.found and outcome.checker in VARIANT.caught_by, outcome.note
    assert outcome.intermittency == Intermittency(failed, 5)
    assert outcome.kind == f"intermittent ({failed}/5)" and "not shrunk" in outcome.note
    [(runs, failing)] = [(n, s) for n, s in world.seen.values() if n > 1]
    assert runs == 5 and same_case(failing, outcome.scenario)  # its rerun and 3 more
    assert outcome.examples == sum(n for n, _ in world.seen.values())  # nothing after it
    document = outcome.to_json_dict()
    assert (document["kind"], document["failed_runs"], document["runs"]) == (
        f"intermittent ({failed}/5)", failed, 5)
    # Saved like any finding: the scenario, its seed in its config, and the log entry.
    saved = json.loads(Path(outcome.replay.split("--scenario ")[1].split()[0]).read_text())
    assert f"failed {failed} of 5 runs" in saved["description"] and "seed" in saved["config"]
    assert saved["expect"]["caught_by"] == outcome.checker
    [entry] = [e for e in read_log(tmp_path / "log.jsonl") if isinstance(e, FindingEntry)]
    assert entry.found and entry.intermittency == Intermittency(failed, 5)


def test_the_command_exits_1_on_an_intermittent_failure_and_prints_how_often_it_failed(
        monkeypatch, capsys, tmp_path):
    searched = command.fuzz

    def failing_once(variant, run, **kwargs):
        world = CountingWorld(SimpleNamespace(run=run), lambda nth, _: nth >= 2)
        return searched(variant, world.run, **kwargs)

    monkeypatch.setattr(command, "fuzz", failing_once)
    code = main(["fuzz", "--variant", VARIANT.name, "--nproc", "2", "--examples", "80",
                 "--hypothesis-seed", "1", "--no-database", "--log", str(tmp_path / "log"),
                 "--found-dir", str(tmp_path / "found")])
    out = capsys.readouterr().out
    assert code == EXIT_FOUND, out
    assert "intermittent (1/5): failed 1 of 5 runs" in out
    assert "not shrunk" in out and "shrunk scenario" not in out


def test_shrink_steps_run_once_and_only_the_first_and_the_shrunk_failure_run_twice(tmp_path):
    with SimWorld(2, FUZZ_TIMEOUTS) as sim:
        world = CountingWorld(sim, lambda nth, _: False)
        outcome = search(world, tmp_path)
    assert outcome.found and not outcome.unconfirmed
    # A failure on every run is reproducible, and shrunk after it was found.
    assert outcome.intermittency is None and outcome.kind == "reproducible"
    assert "not shrunk" not in outcome.note
    assert outcome.examples > outcome.examples_to_detection
    twice = [s for key, (n, s) in world.seen.items() if n >= 2]
    assert 1 <= len(twice) <= 2, [s.to_json() for s in twice]
    assert any(same_case(s, outcome.scenario) for s in twice)
    assert outcome.examples == len(world.seen) + len(twice)  # every run counted


def test_a_shrunk_failure_that_does_not_fail_again_gives_way_to_the_first_one(tmp_path):
    first: list = []

    def passes_again(nth, scenario):
        if nth == 2 and not first:
            first.append(scenario)  # the first rerun confirms the first failure found
            return False
        return nth >= 2 and not same_case(scenario, first[0])

    with SimWorld(2, FUZZ_TIMEOUTS) as sim:
        world = CountingWorld(sim, passes_again)
        outcome = search(world, tmp_path)
    assert outcome.found
    assert outcome.unconfirmed, "the shrunk failures that passed on their rerun are noted"
    assert outcome.intermittency is None  # the first failure failed on its rerun
    assert same_case(outcome.scenario, first[0])


def test_a_failure_that_failed_its_rerun_stays_a_finding_when_hypothesis_cannot_replay_it(
        monkeypatch, tmp_path):
    failing = load_scenario(Path(__file__).resolve().parents[1] / "scenarios" /
                            "guard-equality.json")

    def unreplayable(search, *_):
        def probe():
            search.verdict(failing)  # found, and failing on its rerun
            search.last_failing = failing
            raise FlakyFailure("Inconsistent results from replaying", [ValueError("gone")])
        return probe

    monkeypatch.setattr(engine, "_hypothesis_test", unreplayable)
    with SimWorld(2, FUZZ_TIMEOUTS) as sim:
        outcome = fuzz(VARIANT, sim.run, world="sim", dp_sizes=(2,), budget=BUDGET,
                       database=None, scenario_dir=tmp_path)
    assert outcome.found and outcome.checker == "no_empty_region", outcome.note
    assert outcome.note.startswith("flaky: a failure did not replay the same way")
    assert outcome.intermittency is None
