"""The DP sync of one step (docs/spec.md §1, the decision cases of §9.1, the bugs of §7.1-7.2).

Expectations are worked out by hand from the reference; `plan_without_world` runs the same
decision code every rank runs, on the matrix the all-reduce would gather.
"""

from __future__ import annotations

import pytest

from harness.batch import RankBatch
from harness.check.agreement import first_disagreement
from harness.config import CudaGraphMode, Guard, HarnessConfig
from harness.sut.dp_sync import (
    ROW_ALLOW_UBATCH,
    ROW_CG_MODE,
    ROW_NUM_REQS,
    ROW_TOKENS,
    ROW_UCT,
    gathered_rows,
)
from harness.sut.step_plan import graph_table_for, plan_without_world

# The fixture values of vLLM's slicing tests (docs/spec.md §9), with room for 128 requests.
THRESHOLDS = {"decode_threshold": 32, "prefill_threshold": 128}


def graph_config(**changes) -> HarnessConfig:
    base = dict(dp_size=2, capture_sizes=(64, 128), max_num_reqs=256,
                max_num_batched_tokens=1024, **THRESHOLDS)
    base.update(changes)
    return HarnessConfig.of(**base)


def eager_config(**changes) -> HarnessConfig:
    base = dict(dp_size=2, cudagraph_mode="NONE", max_num_reqs=256,
                max_num_batched_tokens=1024, **THRESHOLDS)
    base.update(changes)
    return HarnessConfig.of(**base)


def decode(*tokens: int) -> list[RankBatch]:
    return [RankBatch.uniform(n, 1) for n in tokens]


def mixed(*tokens: int) -> list[RankBatch]:
    return [RankBatch.uniform(n, None, num_reqs=max(1, n // 4) if n else 0) for n in tokens]


def test_each_rank_fills_only_its_own_column_of_the_gathered_matrix():
    config = graph_config()
    batches = [RankBatch.uniform(64, 1), RankBatch.uniform(40, None, num_reqs=10,
                                                           allow_ubatching=False)]
    rows = gathered_rows([graph_table_for(config, r) for r in range(2)], batches)
    assert rows[ROW_TOKENS] == [64, 40]
    assert rows[ROW_CG_MODE] == [CudaGraphMode.FULL.value, CudaGraphMode.FULL.value]
    assert rows[ROW_UCT] == [1, 0]
    assert rows[ROW_ALLOW_UBATCH] == [1, 0]
    assert rows[ROW_NUM_REQS] == [64, 10]


def test_equal_decode_ranks_replay_the_microbatched_twin_of_their_size():
    plans = plan_without_world(graph_config(), decode(64, 64))
    for plan in plans:
        assert plan.kind == "full-microbatched"
        assert (plan.desc.num_tokens, plan.desc.num_reqs, plan.desc.num_ubatches) == (64, 64, 2)
        assert plan.state.num_tokens_across_dp == (64, 64)
        assert plan.state.eager is False


def test_a_rank_below_half_the_graph_sends_every_rank_to_eager_microbatching():
    # [33, 128]: the threshold holds on 33, the 128 twin is dispatched, 33 cannot fill it.
    plans = plan_without_world(graph_config(), decode(33, 128))
    for plan in plans:
        assert plan.kind == "eager-microbatched"
        assert plan.desc.num_ubatches == 2
        assert plan.state.eager is True
        assert plan.state.num_tokens_across_dp == (128, 128)
    assert [r.real_tokens for r in plans[0].regions] == [33, 0]


def test_every_dp_rank_must_agree_to_microbatch_a_prefill():
    assert plan_without_world(eager_config(), mixed(256, 256))[0].desc.num_ubatches == 2
    assert plan_without_world(eager_config(), mixed(256, 100))[0].desc.num_ubatches == 1
    assert plan_without_world(eager_config(), mixed(100, 256))[1].desc.num_ubatches == 1


def test_the_decode_threshold_only_applies_when_every_rank_is_a_uniform_decode():
    config = eager_config()
    assert plan_without_world(config, decode(64, 64))[0].desc.num_ubatches == 2
    one_mixed = [RankBatch.uniform(64, 1), RankBatch.uniform(64, None, num_reqs=16)]
    # 64 is below the prefill threshold of 128, so the mixed rank vetoes microbatching.
    assert plan_without_world(config, one_mixed)[0].desc.num_ubatches == 1


def test_microbatching_pads_every_rank_to_the_largest():
    plans = plan_without_world(eager_config(), mixed(200, 256))
    assert [p.desc.num_tokens for p in plans] == [256, 256]
    assert plans[0].state.num_tokens_across_dp == (256, 256)
    assert [r.tokens for r in plans[0].regions] == [128, 128]


def test_eager_microbatching_survives_a_rank_that_cannot_fill_the_second_microbatch():
    plans = plan_without_world(eager_config(), mixed(128, 512))
    assert plans[0].desc.num_tokens == 512 and plans[0].desc.num_ubatches == 2
    assert [r.real_tokens for r in plans[0].regions] == [128, 0]


def test_a_rank_that_disallows_microbatching_turns_it_off_for_all():
    batches = [RankBatch.uniform(64, 1), RankBatch.uniform(64, 1, allow_ubatching=False)]
    assert {p.desc.num_ubatches for p in plan_without_world(graph_config(), batches)} == {1}


def test_a_rank_at_exactly_half_the_graph_falls_back_to_eager_with_the_fixed_guard():
    for tokens in [(64, 128), (64, 100), (64, 65)]:
        plans = plan_without_world(graph_config(), decode(*tokens))
        assert {p.kind for p in plans} == {"eager-microbatched"}, tokens


def test_the_merged_guard_replays_a_graph_whose_second_microbatch_is_all_padding():
    # Bug §7.1 of docs/spec.md: 2 * 64 < 128 is false, so vllm 0.33.0 replays the 128 twin.
    plans = plan_without_world(graph_config(guard="merged"), decode(64, 128))
    assert {p.kind for p in plans} == {"full-microbatched"}
    assert plans[0].desc.num_tokens == 128
    assert [r.real_tokens for r in plans[0].regions] == [64, 0]


def test_one_token_past_half_the_graph_fills_both_microbatches():
    for guard in Guard:
        plans = plan_without_world(graph_config(guard=guard), decode(65, 128))
        assert {p.kind for p in plans} == {"full-microbatched"}, guard
        assert all(r.real_tokens > 0 for r in plans[0].regions)


def test_the_literal_two_lets_a_three_way_split_replay_with_an_empty_last_region():
    # docs/spec.md §7.2: k = 3, one 96-token graph, tokens [50, 96]; regions [0,32) [32,64)
    # [64,96).
    config = graph_config(enable_dbo=False, ubatch_size=3, capture_sizes=(96,),
                          decode_threshold=3, prefill_threshold=3)
    for guard in (Guard.MERGED, Guard.STRICT_K2):
        plans = plan_without_world(config.with_changes(guard=guard), decode(50, 96))
        assert {p.kind for p in plans} == {"full-microbatched"}, guard
        assert [r.real_tokens for r in plans[0].regions] == [32, 18, 0]
    fixed = plan_without_world(config, decode(50, 96))
    assert {p.kind for p in fixed} == {"eager-microbatched"}


def test_the_fixed_guard_replays_a_three_way_split_once_the_last_region_has_a_token():
    config = graph_config(enable_dbo=False, ubatch_size=3, capture_sizes=(96,),
                          decode_threshold=3, prefill_threshold=3)
    assert {p.kind for p in plan_without_world(config, decode(64, 96))} == {"eager-microbatched"}
    assert {p.kind for p in plan_without_world(config, decode(65, 96))} == {"full-microbatched"}


def test_below_the_decode_threshold_ranks_take_the_normal_branch_and_pad_to_the_graph():
    plans = plan_without_world(graph_config(), decode(10, 20))
    for plan in plans:
        assert plan.kind == "full"
        assert (plan.desc.num_tokens, plan.desc.num_reqs) == (64, 64)
        assert plan.state.num_tokens_across_dp == (64, 64)
        assert plan.state.num_reqs == 64
        assert plan.regions == ()


def test_a_rank_voting_eager_keeps_every_rank_eager_at_its_own_size():
    # Above the largest capture size a rank's local dispatch votes NONE; the vote is a minimum.
    config = graph_config(max_num_reqs=512)
    plans = plan_without_world(config, [RankBatch.uniform(20, 1), RankBatch.uniform(300, 1)])
    assert [p.kind for p in plans] == ["eager", "eager"]
    assert [p.num_tokens for p in plans] == [20, 300]
    assert plans[0].state.num_tokens_across_dp == (20, 300)
    assert plans[0].state.num_reqs == 300


def test_an_all_idle_step_runs_every_ranks_dummy_batch_in_the_smallest_graph():
    # vLLM's execute_dummy_batch: one request of decode_query_len tokens, a uniform decode.
    plans = plan_without_world(graph_config(), decode(0, 0))
    assert [(p.kind, p.desc.label(), p.num_tokens, p.real_tokens) for p in plans] == [
        ("full", "FULL/64tok/64req", 64, 0)] * 2
    assert plans[0].state.num_tokens_across_dp == (64, 64)


def test_an_idle_rank_keeps_the_step_from_being_microbatched():
    plans = plan_without_world(graph_config(), decode(0, 64))
    assert {p.desc.num_ubatches for p in plans} == {1}
    assert first_disagreement(plans) is None


def test_an_idle_ranks_dummy_batch_votes_full_so_its_peers_still_replay_a_graph():
    # The dummy votes its own dispatch (FULL) and a uniform decode: nobody falls back to eager,
    # and the idle rank pads to the agreed graph (vLLM issue #26137 is where it does not).
    plans = plan_without_world(graph_config(), decode(0, 100))
    assert [(p.kind, p.desc.label(), p.num_tokens, p.num_reqs) for p in plans] == [
        ("full", "FULL/128tok/128req", 128, 128)] * 2
    assert plans[0].state == plans[1].state
    assert plans[0].state.num_tokens_across_dp == (128, 128)
    assert plans[0].state.uniform_token_count == 1


def test_an_idle_ranks_dummy_batch_keeps_its_allow_ubatching_and_one_padding_token_in_eager():
    # Above every graph the busy rank votes NONE: nobody pads, the idle rank runs its dummy.
    idle = RankBatch.uniform(0, allow_ubatching=False)
    plans = plan_without_world(graph_config(), [idle, RankBatch.uniform(300, None)])
    assert [(p.kind, p.num_tokens, p.num_reqs, p.real_tokens) for p in plans] == [
        ("eager", 1, 1, 0), ("eager", 300, 300, 300)]
    assert plans[0].state.num_tokens_across_dp == (1, 300)


def test_a_full_microbatched_step_pads_requests_to_the_graph():
    plans = plan_without_world(graph_config(), decode(100, 120))
    assert [(p.num_tokens, p.num_reqs) for p in plans] == [(128, 128), (128, 128)]
    assert plans[0].state.num_reqs == 128


def test_an_eager_microbatched_step_pads_tokens_but_not_requests():
    plans = plan_without_world(graph_config(), decode(40, 128))
    assert [(p.num_tokens, p.num_reqs) for p in plans] == [(128, 40), (128, 128)]
    assert plans[0].state.num_reqs == 128


def test_uniform_decode_twins_come_from_the_decode_branch_under_full_and_piecewise():
    config = graph_config(cudagraph_mode="FULL_AND_PIECEWISE")
    plans = plan_without_world(config, decode(100, 128))
    assert {p.kind for p in plans} == {"full-microbatched"}
    mixed_plans = plan_without_world(config.with_changes(enable_dbo=False), mixed(20, 40))
    assert {p.kind for p in mixed_plans} == {"piecewise"}


def test_asymmetric_candidates_make_the_ranks_disagree_on_the_graph():
    # Rank 1 raises its twin threshold to 96: it has no 64 twin and dispatches the 128 one.
    config = graph_config(threshold_offset_rank=1, threshold_offset=64)
    plans = plan_without_world(config, decode(64, 64))
    assert plans[0].kind == "full-microbatched"
    assert plans[1].kind == "eager-microbatched"
    disagreement = first_disagreement(plans)
    assert disagreement is not None and disagreement.field == "cg_mode"
    assert "ranks [0] have 'FULL'" in disagreement.describe()
    assert "ranks [1] have 'NONE'" in disagreement.describe()


@pytest.mark.parametrize("mode", ["FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
def test_symmetric_configs_agree_on_a_skewed_step(mode):
    plans = plan_without_world(graph_config(cudagraph_mode=mode), decode(3, 37, 90, 128)[:2])
    assert first_disagreement(plans) is None
