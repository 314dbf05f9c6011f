"""Judging a stream of histories: a batch never hides a failure, and a failing scenario from
a batch is reported from a run of its own, with every rank's full rows."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from runs_alone import RunsAlone

from harness.check.stream import PASSED_ALONE, judge_stream
from harness.scenario import load_scenario, scenario_from_dict
from harness.timeouts import Timeouts
from harness.world.sim.world import SimWorld

ROOT = Path(__file__).resolve().parents[1]
PLANTED = load_scenario(ROOT / "scenarios" / "guard-equality.json")  # no_empty_region


def clean(tokens: tuple[int, int]):
    data = PLANTED.to_dict()
    data.pop("expect")
    data["steps"] = [{"ranks": list(tokens)}]
    return scenario_from_dict(data)


@pytest.fixture(scope="module")
def world():
    world = SimWorld(2, Timeouts())
    yield world
    world.close()


def test_a_failing_batched_scenario_is_rerun_alone_and_reported_with_full_rows(world):
    scenarios = [clean((20, 24)), PLANTED, clean((32, 32))]
    histories = [replace(world.run(s), batched=True) for s in scenarios]
    # The batch's records of the failing one lack their rows: what is reported must not.
    histories[1] = replace(histories[1], steps=tuple(
        tuple(replace(r, outputs=(), state=()) for r in step) for step in histories[1].steps))
    alone = RunsAlone(world)
    results = list(judge_stream(histories, alone))
    assert alone.asked == [PLANTED]
    assert [r.scenario for r in results] == [scenarios[0], scenarios[2], PLANTED]
    assert [r.ok for r in results] == [True, True, False]
    failed = results[-1]
    assert {v.checker for _, v in failed.failed_verdicts()} >= {"no_empty_region"}
    assert failed.evidence != PASSED_ALONE
    for rank, record in enumerate(failed.steps[0].records):
        assert len(record.outputs) == (16, 32)[rank]  # every real row, from the run alone
        assert len(record.state) == PLANTED.config.serving.max_num_reqs + 1


def test_a_batched_failure_that_passes_alone_is_kept_and_says_so(world):
    # Records of the planted scenario under the name of a clean one: failing in the batch,
    # passing when the clean scenario runs alone.
    fake = replace(world.run(PLANTED), scenario=clean((20, 24)), batched=True)
    results = list(judge_stream([fake], RunsAlone(world)))
    assert len(results) == 1 and not results[0].ok
    assert results[0].evidence == PASSED_ALONE


def test_a_failure_that_ran_alone_is_reported_as_it_is_without_a_rerun(world):
    alone = RunsAlone(world)
    results = list(judge_stream([world.run(PLANTED)], alone))
    assert alone.asked == []
    assert len(results) == 1 and not results[0].ok and results[0].evidence == ""
