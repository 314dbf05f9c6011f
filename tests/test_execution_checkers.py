"""The bugs of vLLM's history planted in the harness (docs/spec.md §7.12-7.15) and the
checkers of harness/check/execution.py that catch them by what each rank ran."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from harness.batch import RankBatch
from harness.check.execution import (
    check_dispatch_capacity,
    check_executes_plan,
    check_split_consensus,
)
from harness.check.judge import judge
from harness.check.reference import ReferenceRows
from harness.check.registry import check_step
from harness.config import HarnessConfig, ubatching_fields
from harness.errors import ConfigError
from harness.history.decision import GraphDescriptor
from harness.history.records import StepRecord
from harness.model.mini_moe import a2a_tokens_per_rank
from harness.scenario import load_scenario
from harness.spec.decision import spec_plans
from harness.sut.graph_manager import GraphManager
from harness.sut.step_plan import plan_without_world
from harness.timeouts import Timeouts
from harness.world.sim.world import SimWorld

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
FAST = Timeouts(collective_s=1.0, hang_s=1.5, step_deadline_s=5.0)
ROWS = ((1.0, 2.0),)
STATE = ((0.5, 0.5), (0.0, 0.0))


def config(ranks: int, **changes) -> HarnessConfig:
    fields = {"dp_size": ranks, "capture_sizes": (16, 32), "max_num_reqs": 32,
              "max_num_batched_tokens": 64, "decode_threshold": 8, "prefill_threshold": 16}
    return HarnessConfig.of(**{**fields, **changes})


def eager_split_records(ranks: int) -> list[StepRecord]:
    """Rank 0 at 10 tokens cannot reach the last region of 32: every rank splits eagerly."""
    batches = [RankBatch.uniform(10 if r == 0 else 32, 1) for r in range(ranks)]
    records = []
    for plan in plan_without_world(config(ranks), batches):
        assert plan.kind == "eager-microbatched"
        n = plan.real_tokens
        split = ((0, min(n, 16), 0, 16), (min(n, 16) - (n <= 16), plan.num_reqs, 16, 32))
        records.append(StepRecord(
            rank=plan.rank, step=0, plan=plan, executed="eager-microbatched",
            captured_split=(), replay_split=(), fingerprint=(), routes=(), outputs=ROWS,
            state=STATE, threads_alive=(), pending_run=False, error=None,
            injected_fault=False, seconds=0.01, ran_split=split, a2a_tokens_per_rank=64))
    return records


def failing(records) -> dict[str, str]:
    reference = ReferenceRows((ROWS,) * len(records), (STATE,) * len(records),
                              ((),) * len(records))
    return {v.checker: v.detail for v in check_step(records, reference, 5.0) if not v.ok}


@pytest.mark.parametrize("ranks", [3, 4])
def test_an_eager_split_padded_to_more_requests_on_the_last_rank_only_fails_eager_slices(ranks):
    records = eager_split_records(ranks)
    assert failing(records) == {}
    last = records[-1]
    padded = (*last.ran_split[:-1], last.ran_split[-1][:1] + (last.plan.num_reqs + 3,)
              + last.ran_split[-1][2:])
    records[-1] = replace(last, ran_split=padded)
    failed = failing(records)
    assert set(failed) == {"eager_slices"}, failed
    assert failed["eager_slices"].startswith(f"rank {ranks - 1} (no graph replayed) ran "
                                             f"microbatch slices padded to 35 requests")


@pytest.mark.parametrize("ranks", [3, 4])
def test_an_eager_split_at_other_token_bounds_on_the_last_rank_fails_eager_slices(ranks):
    records = eager_split_records(ranks)
    last = records[-1]
    shifted = ((0, 15, 0, 15), (15, last.plan.num_reqs, 15, 32))
    records[-1] = replace(last, ran_split=shifted)
    failed = failing(records)
    assert set(failed) == {"eager_slices"}, failed
    assert f"rank {ranks - 1} ran token slices [(0, 15), (15, 32)]" in failed["eager_slices"]


def test_a_plan_that_replays_a_graph_but_ran_eagerly_fails_executes_plan():
    rec = eager_split_records(2)[1]
    twin = GraphDescriptor(config(2).serving.cudagraph_mode, 32, 32, 1, num_ubatches=2)
    full = replace(rec, plan=replace(rec.plan, desc=twin))
    assert not check_executes_plan([rec, full]).ok
    assert "not found under its descriptor" in check_executes_plan([rec, full]).detail
    assert check_executes_plan([rec, replace(full, executed="replay",
                                              replayed=twin.label())]).ok
    # An eager plan run as a replay (or unsplit) is not what it planned either.
    assert not check_executes_plan([replace(rec, executed="eager")]).ok


def test_split_consensus_names_the_rank_that_left_alone_even_when_its_peers_failed():
    records = eager_split_records(3)
    alone = replace(records[0], plan=replace(records[0].plan, desc=replace(
        records[0].plan.desc, num_ubatches=1)), ran_split=((0, 10, 0, 10),))
    # Its peers time out in the all-to-alls it never joined: they ran no slice to count.
    peers = [replace(r, error=None, ran_split=()) for r in records[1:]]
    verdict = check_split_consensus([alone, *peers])
    assert not verdict.ok
    assert verdict.detail.startswith("ranks [0] opted out of microbatching alone")
    assert check_split_consensus(records).ok


def test_dispatch_capacity_holds_a_step_to_the_buffers_the_rank_has():
    records = eager_split_records(2)
    assert check_dispatch_capacity(records).ok
    small = [replace(r, a2a_tokens_per_rank=16) for r in records]
    assert check_dispatch_capacity(small).ok  # each 16-token microbatch fits
    unsplit = replace(small[1], plan=replace(small[1].plan, regions=()))
    verdict = check_dispatch_capacity([small[0], unsplit])
    assert not verdict.ok and verdict.detail.startswith("rank 1 runs its eager-microbatched")


def test_the_twin_key_of_the_first_two_microbatches_differs_from_the_total_only_for_k_above_2():
    def key(k: int, tokens: int) -> int:
        cfg = HarnessConfig.of(capture_key="first-two", **ubatching_fields(k),
                               capture_sizes=(tokens,),
                               decode_threshold=k, prefill_threshold=k)
        manager = GraphManager.__new__(GraphManager)
        manager.config = cfg
        return manager.store_key(GraphDescriptor(cfg.serving.cudagraph_mode, tokens, tokens, 1,
                                                 num_ubatches=k)).num_tokens

    assert [key(2, 12), key(2, 13), key(3, 12), key(4, 12), key(3, 14)] == [12, 13, 8, 6, 8]


def test_the_all_to_all_buffers_take_the_largest_batch_or_one_microbatch_of_it():
    assert a2a_tokens_per_rank(config(2)) == 64
    assert a2a_tokens_per_rank(config(2, a2a_buffers="microbatch")) == 32
    three = config(2, a2a_buffers="microbatch", enable_dbo=False, ubatch_size=3)
    assert a2a_tokens_per_rank(three) == 22


@pytest.mark.parametrize("field", ["capture_key", "eager_slices", "a2a_buffers", "ubatch_vote"])
def test_an_unknown_bug_switch_value_is_refused_naming_its_field(field):
    with pytest.raises(ConfigError) as error:
        config(2, **{field: "sometimes"})
    assert error.value.field == field


def test_the_rank_local_vote_is_refused_for_vllms_decision_code():
    with pytest.raises(ConfigError) as error:
        config(2, ubatch_vote="rank-local", sut="vllm")
    assert error.value.field == "ubatch_vote"


def test_the_spec_oracle_plans_no_rank_local_opt_out_where_the_decision_code_does():
    cfg = config(2, ubatch_vote="rank-local", prefill_threshold=8)
    batches = [RankBatch.from_query_lens([8]), RankBatch.from_query_lens([4, 4])]
    harness, spec = plan_without_world(cfg, batches), spec_plans(cfg, batches)
    assert [p.desc.num_ubatches for p in harness] == [1, 2]
    # The spec plants no bug: both ranks split, as the synced vote decides.
    assert [p.desc.num_ubatches for p in spec] == [2, 2]
    assert spec == plan_without_world(config(2, prefill_threshold=8), batches)


def run(scenario):
    with SimWorld(scenario.config.serving.dp_size, FAST) as world:
        return judge(world.run(scenario))


def test_a_rank_that_opts_out_alone_ends_as_named_bounded_verdicts_not_a_hang():
    scenario = load_scenario(SCENARIOS / "rank-local-ubatch-opt-out.json")
    result = run(scenario)
    details = {v.checker: v.detail for _, v in result.failed_verdicts()}
    assert details["split_consensus"].startswith("ranks [0] opted out of microbatching alone")
    # Its peer waits in an all-to-all rank 0 never joins, bounded by the collective timeout.
    assert "CollectiveTimeout" in details["errors"] and "liveness" not in details
    assert all(r.seconds < FAST.step_deadline_s for r in result.steps[0].records)
