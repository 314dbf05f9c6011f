"""A regression scenario names the checker that catches it, per graph backend where the real
thing shows the bug elsewhere than the emulation."""

from __future__ import annotations

from pathlib import Path

import pytest
from scenario_width import with_dp_size

from harness.errors import ConfigError
from harness.scenario import load_scenario, scenario_from_dict

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
BASE = {"steps": [{"ranks": [20, 24]}],
        "config": {"capture_sizes": [16, 32], "max_num_reqs": 32,
                   "max_num_batched_tokens": 64, "decode_threshold": 8,
                   "prefill_threshold": 16}}


def test_the_side_stream_capture_is_caught_at_start_up_on_cuda_and_by_its_empty_graph_else():
    scenario = load_scenario(SCENARIOS / "capture-on-side-stream.json")
    assert scenario.expected_checker("emulated") == "graphs_capture_work"
    assert scenario.expected_checker("cuda") == "startup"


def test_a_scenario_without_a_per_backend_checker_expects_the_same_one_everywhere():
    scenario = load_scenario(SCENARIOS / "guard-equality.json")
    assert scenario.expected_checker("cuda") == scenario.expected_checker("emulated") \
        == "no_empty_region"


def test_per_backend_checkers_survive_a_round_trip_and_go_with_the_bug():
    scenario = scenario_from_dict({**BASE, "expect": {
        "caught_by": "graphs_capture_work", "caught_by_on": {"cuda": "startup"},
        "reference": {"capture_on": "runner"}}})
    again = scenario_from_dict(scenario.to_dict())
    assert again.expected_checker("cuda") == "startup"
    assert with_dp_size(again, 3).expected_checker("cuda") == "startup"
    fixed = again.with_reference_behaviour()
    assert fixed.expected_checker("cuda") is None and fixed.caught_by_on == ()


@pytest.mark.parametrize("caught_by_on, field", [
    ({"tpu": "startup"}, "expect.caught_by_on.tpu"),
    ({"cuda": 3}, "expect.caught_by_on.cuda"),
    (["cuda"], "expect.caught_by_on"),
])
def test_a_malformed_per_backend_checker_is_refused_naming_the_field(caught_by_on, field):
    with pytest.raises(ConfigError) as error:
        scenario_from_dict({**BASE, "expect": {"caught_by": "startup",
                                               "caught_by_on": caught_by_on}})
    assert error.value.field == field
