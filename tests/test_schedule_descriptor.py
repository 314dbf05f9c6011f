"""`Schedule`, the descriptor a scenario carries: plain JSON both ways, and one clear error
naming the field for anything else."""

from __future__ import annotations

import json

import pytest

from harness.errors import ConfigError
from harness.runtime.schedule import Schedule


@pytest.mark.parametrize("schedule", [
    Schedule(),
    Schedule("random", seed=7),
    Schedule("pct", seed=3, depth=2, steps=40),
    Schedule("exhaustive", preemptions=1, choices=(0, 2, 1)),
    Schedule("random", choices=()),
])
def test_a_schedule_survives_a_round_trip_through_json_text(schedule):
    text = json.dumps(schedule.to_json())
    assert Schedule.from_json(json.loads(text)) == schedule


def test_choices_appear_in_json_only_when_recorded():
    assert "choices" not in Schedule("random").to_json()
    assert Schedule("random", choices=(1, 0)).to_json()["choices"] == [1, 0]


@pytest.mark.parametrize("data, field", [
    ({"mode": "fast"}, "schedule.mode"),
    ({"mode": "random", "seed": "1"}, "schedule.seed"),
    ({"mode": "random", "seed": True}, "schedule.seed"),
    ({"mode": "pct", "depth": 0}, "schedule.depth"),
    ({"mode": "exhaustive", "preemptions": -1}, "schedule.preemptions"),
    ({"mode": "pct", "steps": 0}, "schedule.steps"),
    ({"mode": "random", "choices": [0, -1]}, "schedule.choices"),
    ({"mode": "random", "choices": "01"}, "schedule.choices"),
    ({"mode": "os", "choices": [0]}, "schedule.choices"),
    ({"mode": "random", "sead": 1}, "schedule.sead"),
])
def test_a_bad_field_is_one_config_error_that_names_it(data, field):
    with pytest.raises(ConfigError) as info:
        Schedule.from_json(data)
    assert info.value.field == field


def test_only_the_os_mode_is_uncontrolled():
    assert [m for m in ("os", "random", "pct", "exhaustive") if Schedule(m).controlled] == [
        "random", "pct", "exhaustive"]
