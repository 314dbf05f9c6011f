"""One rank-input type: a rank's input is built once per example (a scenario parsed, an
example drawn) and the worlds and the reference are given that very object; its one wire
form reads back equal."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from harness.batch import RankBatch
from harness.check import reference
from harness.check.judge import judge
from harness.config import HarnessConfig
from harness.errors import ConfigError
from harness.fuzz.engine import FUZZ_TIMEOUTS, scenario_strategy
from harness.fuzz.variants import variant_named
from harness.gen.aim import steering
from harness.scenario import Scenario, load_scenario, scenario_from_dict
from harness.sut.rank_runtime import RankRuntime
from harness.world.sim.world import SimWorld

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
SMALL = {"capture_sizes": [16, 32], "max_num_reqs": 32, "max_num_batched_tokens": 64,
         "decode_threshold": 8, "prefill_threshold": 16}


class Constructions:
    """Counts every RankBatch built while installed (the worlds' threads included)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self._lock = threading.Lock()
        original = RankBatch.__init__

        def counting(batch, *args, **kwargs):
            with self._lock:
                self.count += 1
            original(batch, *args, **kwargs)

        monkeypatch.setattr(RankBatch, "__init__", counting)

    def take(self) -> int:
        with self._lock:
            count, self.count = self.count, 0
        return count


def rank_inputs(scenario: Scenario) -> int:
    return sum(len(ranks) for ranks in scenario.steps)


def busy(scenario: Scenario) -> bool:
    # An idle rank votes with vLLM's dummy batch, built where it decides: no rank input.
    return all(r.num_tokens for ranks in scenario.steps for r in ranks)


# -- the wire form -------------------------------------------------------------------------


@pytest.mark.parametrize("data", [
    {"tokens": 0}, {"tokens": 5}, {"query_lens": [1, 3, 2]},
    {"tokens": 4, "allow_ubatching": False}, {"query_lens": [2], "allow_skip_drafts": True},
])
def test_a_rank_read_from_its_wire_form_writes_back_the_same_form(data):
    batch = RankBatch.from_dict(data, decode_query_len=3)
    assert batch.to_dict() == data
    assert RankBatch.from_dict(json.loads(json.dumps(batch.to_dict())), decode_query_len=3) \
        == batch


def test_a_tokens_count_is_that_many_one_token_requests_and_a_bare_integer_is_one():
    assert RankBatch.from_dict({"tokens": 3}) == RankBatch.from_query_lens((1, 1, 1))
    assert RankBatch.from_dict(3) == RankBatch.from_dict({"tokens": 3})
    assert RankBatch.from_dict({"query_lens": [1, 1]}).to_dict() == {"tokens": 2}


def test_a_rank_field_that_does_not_fit_is_refused_naming_it():
    with pytest.raises(ConfigError) as error:
        RankBatch.from_dict({"tokens": 2, "allow_ubatching": "no"}, "steps[0].ranks[1]")
    assert error.value.field == "steps[0].ranks[1].allow_ubatching"


def test_a_tokens_count_above_the_bound_stays_a_count_for_validation_to_refuse():
    batch = RankBatch.from_dict({"tokens": 10**12}, max_tokens=64)
    assert batch.query_lens is None and batch.num_tokens == 10**12


def test_every_scenario_file_writes_its_ranks_back_as_they_are_on_disk():
    for path in sorted(SCENARIOS.rglob("*.json")):
        on_disk = json.loads(path.read_text())["steps"]
        written = load_scenario(path).to_dict()["steps"]
        assert written == on_disk, path.name


def test_a_scenario_writes_each_rank_by_the_rank_types_own_wire_form():
    scenario = scenario_from_dict({"config": SMALL, "steps": [
        {"ranks": [{"query_lens": [1, 7]}, {"tokens": 9, "allow_ubatching": False}]}]})
    assert scenario.to_dict()["steps"] == [{"ranks": [r.to_dict() for r in scenario.steps[0]]}]


# -- built once, handed on as is -----------------------------------------------------------


def test_a_scenario_file_builds_each_rank_input_once_and_running_and_judging_builds_none(
        monkeypatch):
    built = Constructions(monkeypatch)
    scenario = load_scenario(SCENARIOS / "guard-equality.json")
    assert built.take() == rank_inputs(scenario)
    with SimWorld(scenario.config.serving.dp_size, FUZZ_TIMEOUTS) as world:
        result = judge(world.run(scenario))
    assert built.take() == 0
    assert not result.ok  # the scenario's bug is still caught: the run really ran


def test_the_reference_and_the_ranks_are_given_the_very_objects_the_scenario_holds(
        monkeypatch):
    scenario = scenario_from_dict({"config": SMALL, "steps": [
        {"ranks": [{"tokens": 16}, {"query_lens": [3, 5]}]},
        {"ranks": [{"tokens": 20}, {"tokens": 0}]}]})
    seen_by_reference, seen_by_ranks = [], []
    spec_plans, step = reference.spec_plans, RankRuntime.step

    def reference_plans(config, batches):
        seen_by_reference.append(tuple(batches))
        return spec_plans(config, batches)

    def rank_step(runtime, i, requests, batch, *rest):
        seen_by_ranks.append((i, runtime.rank, batch))
        return step(runtime, i, requests, batch, *rest)

    monkeypatch.setattr(reference, "spec_plans", reference_plans)
    monkeypatch.setattr(RankRuntime, "step", rank_step)
    with SimWorld(2, FUZZ_TIMEOUTS) as world:
        assert judge(world.run(scenario)).ok
    assert len(seen_by_reference) == 2
    for i, batches in enumerate(seen_by_reference):
        assert all(a is b for a, b in zip(batches, scenario.steps[i], strict=True))
    assert len(seen_by_ranks) == 4
    assert all(batch is scenario.steps[i][rank] for i, rank, batch in seen_by_ranks)


VARIANT = variant_named("reference")  # contained faults now and then
# The fuzzer's own space, and its draft-token configs (their layouts are drawn apart).
PINNED = ({}, {"enable_dbo": False, "decode_query_len": 3})


@pytest.mark.parametrize("pinned", PINNED)
def test_a_fuzz_example_builds_each_rank_input_once_when_drawn_and_never_again(pinned):
    ran = []

    @settings(max_examples=6, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def example(data):
        with pytest.MonkeyPatch.context() as monkeypatch:
            built = Constructions(monkeypatch)
            scenario = data.draw(scenario_strategy(VARIANT, pinned, (2, 3)))
            drawn = built.take()
            assume(busy(scenario))
            assert drawn == rank_inputs(scenario)
            steering(scenario)
            with SimWorld(scenario.config.serving.dp_size, FUZZ_TIMEOUTS) as world:
                judge(world.run(scenario))
            assert built.take() == 0
            ran.append(scenario.config.serving.decode_query_len)

    example()
    assert len(ran) >= 3  # most draws have no idle rank
    assert not pinned or set(ran) == {3}


def test_a_scenario_built_by_hand_binds_its_ranks_to_its_configs_draft_tokens_once():
    config = HarnessConfig.of(dp_size=1, enable_dbo=False, decode_query_len=3)
    given = RankBatch.from_query_lens((1, 3))
    scenario = Scenario(config, ((given,),))
    bound = scenario.steps[0][0]
    assert bound.decode_query_len == 3 and bound.max_query_len == 3
    assert Scenario(config, scenario.steps).steps[0][0] is bound  # already bound: kept

