"""The schedule as part of an example (docs/schedules.md, "Scenarios, run and fuzz"): a
scenario file carries it and reads back the same, an `os` scenario is written as before, and
the fuzzer draws its seed so that failures shrink toward smaller seeds and fewer
preemptions."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import find, settings
from hypothesis import strategies as st

from harness.errors import ConfigError
from harness.fuzz.engine import database_key
from harness.fuzz.schedules import ScheduleSpace, keyed_fields, scheduled
from harness.fuzz.variants import variant_named
from harness.runtime.schedule import OS_SCHEDULE, Schedule
from harness.runtime.schedule.bounded import preemption_points
from harness.scenario import load_scenario, scenario_from_dict

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
DATA = {"config": {"cudagraph_mode": "NONE", "max_num_reqs": 16,
                   "max_num_batched_tokens": 32, "decode_threshold": 4,
                   "prefill_threshold": 16},
        "steps": [{"ranks": [{"tokens": 10}, {"tokens": 12}]},
                  {"ranks": [{"tokens": 6}, {"tokens": 8}]}]}


@pytest.mark.parametrize("schedule", [Schedule("pct", seed=4, depth=2, steps=40),
                                      Schedule("random", seed=9),
                                      Schedule("exhaustive", seed=3, preemptions=1)])
def test_a_scenario_file_carries_its_schedule_and_reads_it_back(schedule):
    scenario = replace(scenario_from_dict(DATA), schedule=schedule)
    text = scenario.to_json()
    assert json.loads(text)["schedule"] == schedule.to_json()
    assert scenario_from_dict(json.loads(text)).schedule == schedule


def test_an_os_scenario_is_written_without_a_schedule_and_every_shipped_one_reads_as_os():
    assert "schedule" not in scenario_from_dict(DATA).to_dict()
    shipped = sorted(SCENARIOS.glob("*.json"))
    assert shipped and all(load_scenario(p).schedule == OS_SCHEDULE for p in shipped)


@pytest.mark.parametrize("schedule, field", [
    ({"mode": "pct", "seed": -1}, "schedule.seed"),
    ({"mode": "slow"}, "schedule.mode"),
    ({"mode": "pct", "sede": 1}, "schedule.sede"),
    ({"mode": "pct", "choices": [0, 1]}, "schedule.choices"),
    ([1, 2], "schedule"),
])
def test_a_bad_schedule_in_a_scenario_is_one_error_naming_its_field(schedule, field):
    with pytest.raises(ConfigError) as info:
        scenario_from_dict({**DATA, "schedule": schedule})
    assert info.value.field == field


def test_shrinking_a_scenario_to_one_step_or_fewer_ranks_keeps_its_schedule():
    scenario = replace(scenario_from_dict(DATA), schedule=Schedule("pct", seed=4))
    assert scenario.only_step(1).schedule == scenario.schedule
    assert scenario.one_token_fewer(0, 1).schedule == scenario.schedule


def _drawn(space: ScheduleSpace, condition=lambda s: True):
    """The smallest scenario Hypothesis finds meeting `condition` (it shrinks to it)."""
    base = scenario_from_dict(DATA)
    return find(scheduled(st.just(base), space), condition,
                settings=settings(max_examples=500, database=None, derandomize=True)).schedule


def test_the_fuzzer_draws_the_seed_of_a_controlled_schedule_and_shrinks_it_toward_zero():
    assert _drawn(ScheduleSpace(Schedule("pct"), draws_seed=True)) == Schedule("pct", seed=0)
    # A failure needing seed 5 or more shrinks to 5 exactly: smaller seeds are tried first.
    found = _drawn(ScheduleSpace(Schedule("pct"), True), lambda s: s.schedule.seed >= 5)
    assert found.seed == 5


def test_exhaustive_draws_shrink_toward_fewer_preemptions():
    space = ScheduleSpace(Schedule("exhaustive", preemptions=2, steps=10), True)

    def preempts(n):
        return lambda s: len(preemption_points(s.schedule.seed, 2, 10)) >= n

    assert len(preemption_points(_drawn(space, preempts(1)).seed, 2, 10)) == 1
    assert preemption_points(_drawn(space, preempts(2)).seed, 2, 10) == frozenset({0, 1})


def test_a_pinned_seed_is_never_drawn_and_os_leaves_the_scenario_as_drawn():
    pinned = ScheduleSpace(Schedule("random", seed=7), draws_seed=False)
    assert _drawn(pinned, lambda s: True).seed == 7
    assert _drawn(ScheduleSpace(OS_SCHEDULE, True)) == OS_SCHEDULE
    assert _drawn(None) == OS_SCHEDULE  # type: ignore[arg-type]


def test_a_controlled_search_keeps_its_failures_apart_from_the_operating_systems():
    variant = variant_named("reference")
    keys = {database_key(variant, keyed_fields({}, space), (2,)) for space in (
        None, ScheduleSpace(OS_SCHEDULE, True), ScheduleSpace(Schedule("pct"), True),
        ScheduleSpace(Schedule("random"), True), ScheduleSpace(Schedule("pct", seed=3), False))}
    assert len(keys) == 4  # os alone, whether named or not, keeps today's key
    assert database_key(variant, keyed_fields({}, None), (2,)) == database_key(variant, {}, (2,))
