"""A scenario moved to a world of another width, for the suites that run on --nproc ranks."""

from __future__ import annotations

from dataclasses import replace

from harness.config import HarnessConfig, config_kwargs
from harness.scenario import Scenario


def with_dp_size(scenario: Scenario, dp_size: int) -> Scenario:
    """The same case on more (or fewer) ranks: extra ranks repeat the last rank's batch."""
    if dp_size == scenario.config.serving.dp_size:
        return scenario
    steps = tuple((ranks + (ranks[-1],) * dp_size)[:dp_size] for ranks in scenario.steps)
    faults = tuple(f for f in scenario.faults if f.rank < dp_size)
    data = scenario.to_dict()
    data["config"]["dp_size"] = dp_size
    offset_rank = data["config"].get("threshold_offset_rank")
    if offset_rank is not None and offset_rank >= dp_size:
        data["config"]["threshold_offset_rank"] = dp_size - 1
    config = HarnessConfig.of(**config_kwargs(data["config"]))
    return replace(scenario, config=config, steps=steps, faults=faults)
