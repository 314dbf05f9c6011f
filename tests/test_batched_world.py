"""Batches through the persistent torchrun world: every scenario comes back, in order; a
scenario that fails in a batch is caught and reported from a run of its own with full rows
and evidence; a rank lost in a batch costs that world, not the scenarios after it."""

from __future__ import annotations

from pathlib import Path

import pytest
from runs_alone import RunsAlone
from scenario_width import with_dp_size

from harness.check.judge import judge
from harness.check.stream import judge_stream
from harness.scenario import load_scenario, scenario_from_dict
from harness.timeouts import Timeouts
from harness.world.torchrun.world import TorchrunWorld

pytestmark = pytest.mark.dist

ROOT = Path(__file__).resolve().parents[1]
TIMEOUTS = Timeouts(collective_s=2.0, hang_s=4.0, step_deadline_s=8.0)


@pytest.fixture(scope="module")
def world(request, nproc):
    world = TorchrunWorld(nproc, request.config.getoption("--backend"), TIMEOUTS,
                          request.config.getoption("--device"))
    yield world
    assert world.close() == []


def planted(name: str, nproc: int):
    return with_dp_size(load_scenario(ROOT / "scenarios" / f"{name}.json"), nproc)


def same_config(scenario, tokens: list[int], name: str):
    data = scenario.to_dict()
    data.pop("expect")
    data["name"], data["steps"] = name, [{"ranks": tokens}]
    return scenario_from_dict(data)


def test_a_checker_failure_inside_a_batch_is_caught_and_rerun_alone(world):
    bug = planted("guard-equality", world.nproc)  # caught by no_empty_region, no rank error
    cleans = [same_config(bug, [20 + i] * world.nproc, f"clean-{i}") for i in range(6)]
    assert judge(world.run(cleans[0])).ok  # the config is captured: the rest may batch
    scenarios = [*cleans[1:3], bug, *cleans[3:]]
    histories = list(world.run_many(scenarios, batch_size=2))
    assert [h.scenario for h in histories] == scenarios
    assert all(h.batched for h in histories)
    alone = RunsAlone(world)
    results = list(judge_stream(histories, alone))
    assert alone.asked == [bug]
    failed = [r for r in results if not r.ok]
    assert [r.scenario for r in failed] == [bug]
    assert "no_empty_region" in {v.checker for _, v in failed[0].failed_verdicts()}
    for rank, record in enumerate(failed[0].steps[0].records):
        assert len(record.outputs) == bug.steps[0][rank].num_tokens


def test_a_rank_lost_inside_a_batch_is_run_alone_and_the_rest_still_come_back(world):
    if world.backend != "gloo":
        pytest.skip("gloo's size check aborts the rank; NCCL compares no sizes")
    bug = planted("a2a-unpadded-sizes", world.nproc)  # a rank aborts in step 1
    first = bug.only_step(0)
    assert judge(world.run(first)).ok
    launches = world.launches
    cleans = [same_config(bug, [20 + i] * world.nproc, f"clean-{i}") for i in range(4)]
    scenarios = [cleans[0], bug, *cleans[1:]]
    histories = list(world.run_many(scenarios, batch_size=4))
    assert [h.scenario for h in histories] == scenarios
    crashed = histories[1]
    assert not crashed.batched  # the one-scenario protocol ran it, with its evidence
    assert world.launches > launches
    errors = [r.error for r in crashed.steps[1] if r.error is not None]
    assert errors and errors[0].kind == "RankCrashed", errors
    assert not judge(crashed).ok
    assert all(judge(h).ok for i, h in enumerate(histories) if i != 1)
