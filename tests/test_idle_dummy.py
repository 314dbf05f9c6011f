"""An idle DP rank runs vLLM's dummy batch (execute_dummy_batch: one uniform-decode request of
decode_query_len tokens): it votes and allows microbatching like a busy rank, and pads to what
the ranks agreed on. vLLM issue #26137 (variant idle-rank-dummy-unpadded) is the dummy run at
its own size; executes_plan catches it by the tokens the rank ran (docs/spec.md §7.16)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from harness.batch import RankBatch
from harness.check.execution import check_executes_plan
from harness.check.judge import judge
from harness.check.reference import ReferenceRows
from harness.check.registry import check_step
from harness.config import HarnessConfig
from harness.history.records import StepRecord
from harness.scenario import load_scenario, scenario_from_dict
from harness.spec.decision import spec_plans
from harness.sut.step_plan import plan_without_world
from harness.timeouts import Timeouts
from harness.world.sim.world import SimWorld

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
FAST = Timeouts(collective_s=1.0, hang_s=1.5, step_deadline_s=5.0)
SMALL = {"capture_sizes": [16, 32], "max_num_reqs": 32, "max_num_batched_tokens": 64,
         "decode_threshold": 8, "prefill_threshold": 16}


def config(ranks: int, **changes) -> HarnessConfig:
    return HarnessConfig.of(**{"dp_size": ranks, **SMALL, **changes})


def records_of(plans) -> list[StepRecord]:
    """Every rank ran what it planned: a replay of its graph, or an eager run of its tokens."""
    out = []
    for p in plans:
        full = p.desc.cg_mode.name == "FULL"
        split = ((0, max(p.num_reqs, 1), 0, max(p.num_tokens, 1)),)
        out.append(StepRecord(
            rank=p.rank, step=0, plan=p, executed="replay" if full else "eager",
            captured_split=split if full else (), replay_split=split if full else (),
            fingerprint=(), routes=(), outputs=(), state=(), threads_alive=(),
            pending_run=False, error=None, injected_fault=False, seconds=0.01,
            replayed=p.desc.label() if full else None, ran_split=split,
            a2a_tokens_per_rank=64))
    return out


def failing(records) -> dict[str, str]:
    n = len(records)
    reference = ReferenceRows(((),) * n, ((),) * n, ((),) * n)
    return {v.checker: v.detail for v in check_step(records, reference, 5.0) if not v.ok}


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_an_idle_last_rank_pads_its_dummy_to_the_full_graph_its_peers_replay(ranks):
    batches = [RankBatch.uniform(20 + r, 1) for r in range(ranks - 1)] + [RankBatch.uniform(0)]
    plans = plan_without_world(config(ranks), batches)
    assert {(p.kind, p.desc.label(), p.num_tokens) for p in plans} == {
        ("full", "FULL/32tok/32req", 32)}
    assert plans[-1].real_tokens == 0 and plans[-1].num_reqs == 32
    assert plans == spec_plans(config(ranks), batches)  # the plain statement agrees


def test_an_idle_rank_next_to_a_mixed_batch_pads_to_the_agreed_piecewise_size():
    cfg = config(3, cudagraph_mode="FULL_AND_PIECEWISE")
    batches = [RankBatch.from_query_lens([2, 3]), RankBatch.uniform(20, 1), RankBatch.uniform(0)]
    plans = plan_without_world(cfg, batches)
    assert [(p.kind, p.num_tokens) for p in plans] == [("piecewise", 32)] * 3
    assert plans == spec_plans(cfg, batches)


@pytest.mark.parametrize("ranks", [3, 4])
def test_an_idle_last_rank_replaying_the_graph_of_its_own_dummy_fails_executes_plan(ranks):
    batches = [RankBatch.uniform(20, 1)] * (ranks - 1) + [RankBatch.uniform(0)]
    records = records_of(plan_without_world(config(ranks), batches))
    assert failing(records) == {}
    own = ((0, 16, 0, 16),)  # the 16-token graph its one dummy token dispatches to
    records[-1] = replace(records[-1], replayed="FULL/16tok/16req", captured_split=own,
                          replay_split=own, ran_split=own)
    failed = failing(records)
    assert set(failed) == {"executes_plan"}, failed
    assert failed["executes_plan"] == (f"rank {ranks - 1} (idle: its dummy batch) ran 16 "
                                       "tokens (replay), not the 32 of its plan "
                                       "FULL/32tok/32req")


@pytest.mark.parametrize("ranks", [3, 4])
def test_an_idle_last_rank_running_its_dummy_unpadded_in_an_eager_step_fails_executes_plan(
        ranks):
    # Only the tokens ran show it: the plan is not FULL, so no graph label is compared, and
    # the run is unsplit as planned. A check of labels and paths alone passes this.
    cfg = config(ranks, cudagraph_mode="FULL_AND_PIECEWISE")
    batches = ([RankBatch.from_query_lens([2, 3])] * (ranks - 1)) + [RankBatch.uniform(0)]
    records = records_of(plan_without_world(cfg, batches))
    assert failing(records) == {}
    records[-1] = replace(records[-1], ran_split=((0, 1, 0, 1),))
    failed = failing(records)
    assert set(failed) == {"executes_plan"}, failed
    assert failed["executes_plan"].startswith(f"rank {ranks - 1} (idle: its dummy batch) ran "
                                              "1 tokens (eager), not the 16 of its plan")


def test_a_busy_rank_that_ran_fewer_tokens_than_it_padded_to_is_named_without_idle():
    records = records_of(plan_without_world(config(2), [RankBatch.uniform(20, 1)] * 2))
    records[1] = replace(records[1], ran_split=((0, 20, 0, 20),))
    verdict = check_executes_plan(records)
    assert not verdict.ok and verdict.detail.startswith("rank 1 ran 20 tokens (replay)")


def run(scenario):
    with SimWorld(scenario.config.serving.dp_size, FAST) as world:
        return judge(world.run(scenario))


def failed_checkers(result) -> dict[str, str]:
    return {v.checker: v.detail for _, v in result.failed_verdicts()}


def test_the_unpadded_dummy_replays_its_own_graph_on_the_sim_world_and_is_named():
    scenario = load_scenario(SCENARIOS / "idle-rank-dummy-unpadded.json")
    result = run(scenario)
    assert failed_checkers(result) == {"executes_plan": (
        "rank 0 (idle: its dummy batch) ran 16 tokens (replay), not the 32 of its plan "
        "FULL/32tok/32req")}
    assert [r.replayed for r in result.steps[0].records] == ["FULL/16tok/16req",
                                                             "FULL/32tok/32req"]
    clean = run(scenario.with_reference_behaviour())
    assert clean.ok, clean.failed_verdicts()
    assert [r.replayed for r in clean.steps[0].records] == ["FULL/32tok/32req"] * 2


def test_the_unpadded_dummy_in_a_piecewise_step_replays_its_own_graph_on_the_sim_world():
    scenario = scenario_from_dict({
        "name": "idle-dummy-piecewise",
        "config": {**SMALL, "dummy_padding": "unpadded",
                   "cudagraph_mode": "FULL_AND_PIECEWISE"},
        "steps": [{"ranks": [{"tokens": 0}, {"query_lens": [2, 3]}]}],
        "expect": {"caught_by": "executes_plan", "reference": {"dummy_padding": "agreed"}}})
    result = run(scenario)
    assert set(failed_checkers(result)) == {"executes_plan"}
    # Its own one token dispatches to the 16-token FULL decode graph: it replays that.
    assert failed_checkers(result)["executes_plan"] == ("rank 0 plans piecewise "
                                                        "(PIECEWISE/16tok) but ran replay")
    assert run(scenario.with_reference_behaviour()).ok
