"""One exhaustive run picked by its seed (harness/runtime/schedule/bounded.py): the seeds
number every set of at most `preemptions` preemption points once, fewest first, and a run
preempts exactly where its number says."""

from __future__ import annotations

from itertools import combinations

import pytest

from harness.errors import ConfigError
from harness.runtime.schedule import Schedule, explore, run_once
from harness.runtime.schedule.bounded import (
    BoundedPreemptions,
    preemption_points,
    schedules_within,
)
from harness.runtime.ubatching.proof import Step, judge_of, prove, scenario_of


@pytest.mark.parametrize("bound, horizon", [(0, 5), (1, 5), (2, 6), (3, 4)])
def test_the_seeds_number_every_set_of_preemption_points_once_fewest_first(bound, horizon):
    sets = [preemption_points(n, bound, horizon) for n in range(schedules_within(bound,
                                                                                 horizon))]
    expected = {frozenset(c) for size in range(bound + 1)
                for c in combinations(range(horizon), size)}
    assert len(sets) == len(set(sets)) and set(sets) == expected
    assert [len(s) for s in sets] == sorted(len(s) for s in sets)


def test_seed_zero_never_preempts_and_the_next_ones_preempt_once_in_order():
    assert preemption_points(0, 2, 10) == frozenset()
    assert [preemption_points(n, 2, 10) for n in (1, 2, 10)] == [
        frozenset({0}), frozenset({1}), frozenset({9})]
    assert preemption_points(11, 2, 10) == frozenset({0, 1})


def test_a_number_outside_the_bound_is_refused():
    with pytest.raises(ValueError, match="not one of the 11 schedules"):
        preemption_points(11, 1, 10)


def test_an_exhaustive_schedule_whose_seed_is_past_its_count_names_the_seed():
    with pytest.raises(ConfigError) as info:
        Schedule("exhaustive", seed=11, preemptions=1, steps=10)
    assert info.value.field == "schedule.seed" and "0 to 10" in info.value.message


def test_the_strategy_preempts_only_at_the_opportunities_its_number_names():
    strategy = BoundedPreemptions(2, 1, 10)  # opportunity 1 only
    # Thread 0 could go on at every point; a switch where it cannot is free, not counted.
    picks = [strategy.choose(0, 0, (0, 1)), strategy.choose(1, 0, (1, 2)),
             strategy.choose(2, 0, (0, 1)), strategy.choose(3, 0, (0, 1))]
    assert picks == [0, 1, 1, 0]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_numbered_run_of_the_ring_makes_exactly_one_preemption_and_replays(seed):
    step = Step(2)
    schedule = Schedule("exhaustive", seed=seed, preemptions=1, steps=20)
    trace, verdict = run_once(schedule, scenario_of(step), judge_of(step))
    assert verdict is None and trace.preemptions == 1
    again, _ = run_once(schedule, scenario_of(step), judge_of(step))
    assert again.choices == trace.choices


def test_explore_walks_the_same_tree_whatever_seed_the_schedule_carries():
    plain = prove(Step(2), Schedule("exhaustive", preemptions=1))
    numbered = explore(Schedule("exhaustive", seed=5, preemptions=1),
                       scenario_of(Step(2)), judge_of(Step(2)), runs=10**6)
    assert numbered.complete and numbered.visited == plain.visited
