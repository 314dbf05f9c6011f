"""The distributed suite: the same tests on whichever world the session runs
(`--world sim|torchrun`, `--nproc N`): every regression scenario, and Hypothesis over DP skew."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.gen.strategies import configs, rank_batch
from harness.scenario import RankStep, Scenario, load_scenario

pytestmark = pytest.mark.dist

SCENARIOS = sorted((Path(__file__).resolve().parents[1] / "scenarios").glob("*.json"))


def describe(result) -> str:
    failures = "\n".join(f"  step {s}: {v.checker}: {v.detail}"
                         for s, v in result.failed_verdicts())
    return (f"{failures}\n{result.evidence}\nreplay: save the scenario below and run "
            f"`python -m harness run --scenario FILE`\n{result.scenario.to_json()}")


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_each_regression_scenario_is_caught_on_the_world_and_clean_in_the_reference(
        world, path):
    scenario = load_scenario(path).with_dp_size(world.nproc)
    buggy = world.run(scenario)
    assert scenario.caught_by in [v.checker for _, v in buggy.failed_verdicts()], \
        describe(buggy)
    clean = world.run(scenario.with_reference_behaviour())
    assert clean.ok, describe(clean)


@st.composite
def skewed_scenarios(draw, nproc: int) -> Scenario:
    config = draw(configs(dp_sizes=(nproc,)))
    steps = []
    for _ in range(draw(st.integers(1, 2))):
        batches = [draw(rank_batch(config)) for _ in range(nproc)]
        steps.append(tuple(RankStep(b.request_query_lens(), b.allow_ubatching)
                           for b in batches))
    return Scenario(config, tuple(steps), name="hypothesis-skew")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_checker_holds_on_skewed_dp_steps_of_the_reference(world, data):
    scenario = data.draw(skewed_scenarios(world.nproc))
    result = world.run(scenario)
    assert result.ok, describe(result)
