"""A failure is believed only once it fails again (harness/fuzz/engine.py): the first one the
search finds is rerun at once, the shrunk one at the end; the shrink steps between are run
once each. A world that fails a scenario only on some runs stands in for short timeouts on a
loaded machine: its second run of a scenario runs the undone scenario, which passes."""

from __future__ import annotations

from dataclasses import replace

from harness.fuzz.engine import FUZZ_TIMEOUTS, Budget, fuzz
from harness.fuzz.variants import variant_named
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


def search(world: CountingWorld, tmp_path):
    return fuzz(VARIANT, world.run, world="sim", dp_sizes=(2,), fixed=FIXED, budget=BUDGET,
                database=None, seed=1, scenario_dir=tmp_path)


def test_a_failure_that_passes_on_its_rerun_is_not_reported(tmp_path):
    with SimWorld(2, FUZZ_TIMEOUTS) as sim:
        world = CountingWorld(sim, lambda nth, _: nth >= 2)
        outcome = search(world, tmp_path)
    assert not outcome.found
    assert outcome.flaky


def same_case(a, b) -> bool:
    return (a.config, a.steps, a.faults) == (b.config, b.steps, b.faults)


def test_shrink_steps_run_once_and_only_the_first_and_the_shrunk_failure_run_twice(tmp_path):
    with SimWorld(2, FUZZ_TIMEOUTS) as sim:
        world = CountingWorld(sim, lambda nth, _: False)
        outcome = search(world, tmp_path)
    assert outcome.found and not outcome.flaky
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
    assert outcome.flaky, "the shrunk failures that passed on their rerun are noted"
    assert same_case(outcome.scenario, first[0])
