"""Compatibility, twins, candidates, capture order and dispatch (docs/spec.md §2.1-2.2, §9.2,
§7.5)."""

from __future__ import annotations

import pytest

from harness.config import CudaGraphMode, HarnessConfig
from harness.history.decision import GraphDescriptor as D
from harness.sut.descriptor import is_compatible
from harness.sut.graph_table import GraphTable, ubatch_twin

NONE = CudaGraphMode.NONE
P = CudaGraphMode.PIECEWISE
F = CudaGraphMode.FULL


def ladder_config(mode: CudaGraphMode, **changes) -> HarnessConfig:
    """Capture sizes 8/16/32 with 16 requests at most; twins need 16 decode tokens."""
    settings = dict(cudagraph_mode=mode, capture_sizes=(8, 16, 32), max_num_reqs=16,
                    decode_threshold=16, prefill_threshold=512, twins="all")
    settings.update(changes)
    return HarnessConfig.of(**settings)


def fits(desc: D, num_reqs: int = 1, num_tokens: int = 1, uct: int | None = None,
         max_query_len: int | None = None, num_ubatches: int = 1) -> bool:
    return is_compatible(desc, num_reqs=num_reqs, num_tokens=num_tokens, uniform_token_count=uct,
                         max_query_len=max_query_len, num_ubatches=num_ubatches)


# -- compatibility (2.2) -------------------------------------------------------------------


def test_a_graph_for_a_uniform_token_count_only_serves_exactly_that_count():
    desc = D(F, 16, 16, uniform_token_count=1)
    assert fits(desc, 8, 8, uct=1)
    assert not fits(desc, 8, 8, uct=None)
    assert not fits(desc, 4, 8, uct=2)


def test_a_graph_without_a_uniform_token_count_serves_any_count():
    desc = D(F, 16, 16)
    assert fits(desc, 8, 8, uct=1)
    assert fits(desc, 4, 8, uct=2)
    assert fits(desc, 3, 8, uct=None)


def test_a_graph_with_a_max_query_len_needs_a_batch_bound_no_larger():
    desc = D(F, 16, 16, max_query_len=4)
    assert fits(desc, 4, 16, max_query_len=4)
    assert fits(desc, 4, 4, max_query_len=1)
    assert not fits(desc, 3, 15, max_query_len=5)
    assert not fits(desc, 4, 16, max_query_len=None)


def test_a_graph_without_a_max_query_len_serves_any_query_len():
    assert fits(D(F, 16, 16), 2, 16, max_query_len=15)
    assert fits(D(F, 16, 16), 2, 16, max_query_len=None)


def test_a_graph_padded_to_some_requests_cannot_serve_more_requests():
    desc = D(F, 64, 32)
    assert fits(desc, 32, 64)
    assert not fits(desc, 33, 64)


def test_a_graph_without_request_padding_serves_any_request_count():
    assert fits(D(P, 64), 64, 64)


def test_a_graph_cannot_serve_more_tokens_than_it_was_captured_for():
    desc = D(F, 16, 16)
    assert fits(desc, 16, 16)
    assert fits(desc, 1, 1)
    assert not fits(desc, 16, 17)


def test_a_graph_captured_for_two_microbatches_only_serves_a_two_way_split():
    twin = D(F, 16, 16, uniform_token_count=1, num_ubatches=2)
    assert fits(twin, 16, 16, uct=1, num_ubatches=2)
    assert not fits(twin, 16, 16, uct=1, num_ubatches=1)
    assert not fits(twin, 16, 16, uct=1, num_ubatches=3)


def test_an_unsplit_graph_does_not_serve_a_microbatched_step():
    assert not fits(D(F, 16, 16), 16, 16, uct=1, num_ubatches=2)
    assert not fits(D(P, 16), 16, 16, uct=1, num_ubatches=2)


# -- microbatch twins (2.4) ----------------------------------------------------------------

TWIN_CONFIG = HarnessConfig.of(twins="all", enable_dbo=True, decode_threshold=8,
                               prefill_threshold=512)


def test_no_twin_is_made_when_microbatching_is_off():
    config = HarnessConfig.of(twins="all", enable_dbo=False, decode_threshold=8)
    assert ubatch_twin(config, D(F, 16, 16)) is None


@pytest.mark.parametrize("desc", [D(P, 16), D(P, 16, 16), D(NONE, 16, 16)])
def test_only_a_full_graph_gets_a_twin(desc):
    assert ubatch_twin(TWIN_CONFIG, desc) is None


def test_a_full_graph_without_request_padding_gets_no_twin():
    assert ubatch_twin(TWIN_CONFIG, D(F, 16, None)) is None


def test_a_full_graph_whose_tokens_do_not_divide_evenly_over_its_requests_gets_no_twin():
    assert ubatch_twin(TWIN_CONFIG, D(F, 10, 4)) is None


def test_a_full_graph_whose_uniform_count_disagrees_with_its_shape_gets_no_twin():
    assert ubatch_twin(TWIN_CONFIG, D(F, 16, 8, uniform_token_count=1)) is None


@pytest.mark.parametrize("uct", [None, 2])
def test_a_twin_takes_the_uniform_count_its_shape_implies(uct):
    twin = ubatch_twin(TWIN_CONFIG, D(F, 16, 8, uniform_token_count=uct))
    assert twin == D(F, 16, 8, uniform_token_count=2, num_ubatches=2)


def test_a_twin_needs_at_least_one_token_per_microbatch():
    config = HarnessConfig.of(twins="all", enable_dbo=False, ubatch_size=3, decode_threshold=8)
    # A zero threshold (as a rank-offset fault can produce) leaves only the k-token rule.
    assert ubatch_twin(config, D(F, 2, 2), decode_threshold=0) is None
    assert ubatch_twin(config, D(F, 3, 3), decode_threshold=0) == D(
        F, 3, 3, uniform_token_count=1, num_ubatches=3)


def test_a_twin_needs_the_decode_threshold_inclusively():
    config = HarnessConfig.of(twins="all", enable_dbo=True, decode_threshold=32,
                              prefill_threshold=512)
    assert ubatch_twin(config, D(F, 31, 31)) is None
    assert ubatch_twin(config, D(F, 32, 32)) == D(F, 32, 32, uniform_token_count=1,
                                                  num_ubatches=2)


def test_a_twin_is_judged_by_the_decode_threshold_not_the_prefill_one():
    config = HarnessConfig.of(twins="all", enable_dbo=True, decode_threshold=32,
                              prefill_threshold=512)
    # 64 tokens in 32 requests: below the prefill threshold, yet a twin (uniform_decode=True).
    assert ubatch_twin(config, D(F, 64, 32)) == D(F, 64, 32, uniform_token_count=2,
                                                  num_ubatches=2)


def test_an_explicit_decode_threshold_overrides_the_config_one():
    config = HarnessConfig.of(twins="all", enable_dbo=True, decode_threshold=32)
    assert ubatch_twin(config, D(F, 16, 16)) is None
    assert ubatch_twin(config, D(F, 16, 16), decode_threshold=16) is not None


def test_a_twin_has_as_many_microbatches_as_the_config():
    config = HarnessConfig.of(twins="all", enable_dbo=False, ubatch_size=4, decode_threshold=8)
    assert ubatch_twin(config, D(F, 16, 16)) == D(F, 16, 16, uniform_token_count=1,
                                                  num_ubatches=4)


# -- candidates (2.5) ----------------------------------------------------------------------


def test_full_mode_takes_its_twins_from_the_mixed_branch():
    table = GraphTable.build(ladder_config(F))
    assert table.descriptors == (
        D(F, 8, 8),
        D(F, 16, 16),
        D(F, 16, 16, uniform_token_count=1, num_ubatches=2),
        D(F, 32, 16),
        D(F, 32, 16, uniform_token_count=2, num_ubatches=2),
    )


def test_full_mode_without_microbatching_has_no_twins():
    table = GraphTable.build(ladder_config(F, enable_dbo=False))
    assert table.descriptors == (D(F, 8, 8), D(F, 16, 16), D(F, 32, 16))
    assert table.twins == ()


def test_full_and_piecewise_takes_its_twins_from_the_decode_branch_in_0_33_size_order():
    table = GraphTable.build(ladder_config(CudaGraphMode.FULL_AND_PIECEWISE, release="0.33"))
    # The 32-token decode graph would need 32 requests (> 16), so only PIECEWISE covers 32.
    assert table.descriptors == (
        D(F, 8, 8, uniform_token_count=1),
        D(P, 8),
        D(F, 16, 16, uniform_token_count=1),
        D(F, 16, 16, uniform_token_count=1, num_ubatches=2),
        D(P, 16),
        D(P, 32),
    )
    assert all(d.num_reqs is None for d in table.descriptors if d.cg_mode is P)


def test_0_34_generates_the_decode_graphs_by_request_count_before_the_token_keyed_ones():
    table = GraphTable.build(ladder_config(CudaGraphMode.FULL_AND_PIECEWISE, release="0.34"))
    assert table.descriptors == (
        D(F, 8, 8, uniform_token_count=1),
        D(F, 16, 16, uniform_token_count=1),
        D(F, 16, 16, uniform_token_count=1, num_ubatches=2),
        D(P, 8),
        D(P, 16),
        D(P, 32),
    )


def test_0_34_captures_a_decode_graph_at_the_request_limit_that_0_33_leaves_out():
    # Sizes 4 and 32 with 12 requests at most: 32 decode tokens would need 32 requests, so
    # 0.33 captures no decode graph above 4; 0.34 captures the first count past the limit
    # at the limit, 12 requests, and a 10-token decode replays it instead of PIECEWISE 32.
    def table(release: str) -> GraphTable:
        return GraphTable.build(ladder_config(CudaGraphMode.FULL_AND_PIECEWISE, release=release,
                                              capture_sizes=(4, 32), max_num_reqs=12))

    assert D(F, 12, 12, uniform_token_count=1) in table("0.34").descriptors
    assert D(F, 12, 12, uniform_token_count=1) not in table("0.33").descriptors
    assert table("0.34").dispatch(10, 10, 1) == D(F, 12, 12, uniform_token_count=1)
    assert table("0.33").dispatch(10, 10, 1) == D(P, 32)


def test_full_decode_only_has_decode_graphs_and_their_twins_only():
    table = GraphTable.build(ladder_config(CudaGraphMode.FULL_DECODE_ONLY))
    assert table.descriptors == (
        D(F, 8, 8, uniform_token_count=1),
        D(F, 16, 16, uniform_token_count=1),
        D(F, 16, 16, uniform_token_count=1, num_ubatches=2),
    )


def test_graph_mode_none_has_no_candidates():
    table = GraphTable.build(ladder_config(NONE))
    assert table.descriptors == ()
    assert table.capture_order() == ()
    assert table.dispatch(4, 4, 1) == D(NONE, 4, 4)


def test_three_microbatches_give_three_way_twins():
    table = GraphTable.build(ladder_config(F, enable_dbo=False, ubatch_size=3))
    assert table.twins == (D(F, 16, 16, uniform_token_count=1, num_ubatches=3),
                           D(F, 32, 16, uniform_token_count=2, num_ubatches=3))


# -- capture order (2.5 step 5, 2.9 step 2) ------------------------------------------------


def test_piecewise_graphs_are_captured_before_full_ones_largest_first():
    table = GraphTable.build(ladder_config(CudaGraphMode.FULL_AND_PIECEWISE))
    assert table.capture_order() == (
        D(P, 32),
        D(P, 16),
        D(P, 8),
        D(F, 16, 16, uniform_token_count=1),
        D(F, 16, 16, uniform_token_count=1, num_ubatches=2),
        D(F, 8, 8, uniform_token_count=1),
    )


def test_a_twin_is_captured_right_after_its_base_graph():
    table = GraphTable.build(ladder_config(F))
    assert table.capture_order() == (
        D(F, 32, 16),
        D(F, 32, 16, uniform_token_count=2, num_ubatches=2),
        D(F, 16, 16),
        D(F, 16, 16, uniform_token_count=1, num_ubatches=2),
        D(F, 8, 8),
    )


# -- dispatch (2.6) ------------------------------------------------------------------------


def test_dispatch_picks_the_smallest_full_graph_that_fits():
    table = GraphTable.build(ladder_config(F))
    assert table.dispatch(5, 5, None) == D(F, 8, 8)
    assert table.dispatch(8, 8, 1) == D(F, 8, 8)
    assert table.dispatch(9, 9, 1) == D(F, 16, 16)
    assert table.dispatch(12, 20, None) == D(F, 32, 16)


def test_dispatch_picks_the_smallest_twin_for_a_microbatched_uniform_decode():
    table = GraphTable.build(ladder_config(F))
    twin16 = D(F, 16, 16, uniform_token_count=1, num_ubatches=2)
    assert table.dispatch(16, 16, 1, num_ubatches=2) == twin16
    assert table.dispatch(10, 10, 1, num_ubatches=2) == twin16
    assert table.dispatch(16, 32, 2, num_ubatches=2) == D(F, 32, 16, uniform_token_count=2,
                                                          num_ubatches=2)


def test_dispatch_tries_a_graph_for_the_exact_uniform_count_before_a_generic_one():
    config = ladder_config(F)
    generic, specific = D(F, 16, 16), D(F, 16, 16, uniform_token_count=1)
    table = GraphTable(config, 0, (generic, specific))
    assert table.dispatch(16, 16, 1) == specific
    assert table.dispatch(16, 16, None) == generic


def test_dispatch_prefers_any_full_graph_to_a_smaller_piecewise_one():
    table = GraphTable(ladder_config(F), 0, (D(P, 8), D(F, 16, 16)))
    assert table.dispatch(4, 8, None) == D(F, 16, 16)
    assert table.dispatch(4, 16, None) == D(F, 16, 16)


def test_dispatch_falls_back_to_piecewise_when_no_full_graph_fits():
    table = GraphTable.build(ladder_config(CudaGraphMode.FULL_AND_PIECEWISE))
    assert table.dispatch(10, 10, 1) == D(F, 16, 16, uniform_token_count=1)
    assert table.dispatch(4, 10, None) == D(P, 16)
    assert table.dispatch(4, 20, None) == D(P, 32)
    assert table.dispatch(3, 3, 1) == D(F, 8, 8, uniform_token_count=1)


def test_dispatch_above_the_largest_graph_runs_eager_unpadded():
    table = GraphTable.build(ladder_config(F))
    assert table.dispatch(10, 33, None) == D(NONE, 33, 10)
    assert table.dispatch(10, 33, None, num_ubatches=2) == D(NONE, 33, 10, num_ubatches=2)


def test_dispatch_without_a_graph_for_the_split_keeps_the_requested_microbatch_count():
    table = GraphTable.build(ladder_config(F))
    assert table.dispatch(5, 5, 1, num_ubatches=3) == D(NONE, 5, 5, num_ubatches=3)


def test_dispatch_of_an_empty_step_runs_eager():
    table = GraphTable.build(ladder_config(F))
    assert table.dispatch(0, 0, None) == D(NONE, 0, 0)
    assert table.dispatch(0, 0, None, num_ubatches=2) == D(NONE, 0, 0, num_ubatches=2)


def test_microbatched_graphs_are_only_offered_to_uniform_batches():
    # docs/spec.md §9.2 case 2.
    config = HarnessConfig.of(twins="all", cudagraph_mode=F, capture_sizes=(64, 128),
                              max_num_reqs=256, max_num_batched_tokens=256, decode_threshold=32,
                              prefill_threshold=128)
    table = GraphTable.build(config)
    assert table.dispatch(64, 64, 1, num_ubatches=2) == D(F, 64, 64, uniform_token_count=1,
                                                          num_ubatches=2)
    assert table.dispatch(8, 64, None, num_ubatches=2) == D(NONE, 64, 8, num_ubatches=2)


# -- never-replayable twins (spec §7.5) ---------------------------------------------------------

SMALL = dict(cudagraph_mode=F, capture_sizes=(4, 8), max_num_reqs=4, decode_threshold=4,
             prefill_threshold=4, twins="all")  # vLLM's behaviour: every eligible twin
TWIN4 = D(F, 4, 4, uniform_token_count=1, num_ubatches=2)
TWIN8 = D(F, 8, 4, uniform_token_count=2, num_ubatches=2)


def test_a_twin_that_needs_two_tokens_per_request_is_never_replayable():
    table = GraphTable.build(HarnessConfig.of(**SMALL))
    assert table.twins == (TWIN4, TWIN8)
    assert table.unreachable_twins() == (TWIN8,)
    assert table.reaching_batch_size(TWIN4) == 4
    assert table.reaching_batch_size(TWIN8) is None


def test_capturing_only_reachable_twins_drops_the_never_replayable_one():
    table = GraphTable.build(HarnessConfig.of(**{**SMALL, "twins": "reachable"}))
    assert TWIN8 not in table.descriptors
    assert table.descriptors == (D(F, 4, 4), TWIN4, D(F, 8, 4))


def test_the_default_ladder_captures_a_never_replayable_twin_at_its_largest_size():
    # 128 requests: largest default size 256 = 2 * 128, so its twin has 2 tokens per request;
    # sizes 136..248 are not multiples of 128 and get no twin.
    table = GraphTable.build(HarnessConfig.of(twins="all", max_num_reqs=128,
                                              max_num_batched_tokens=256))
    assert table.unreachable_twins() == (D(F, 256, 128, uniform_token_count=2, num_ubatches=2),)
    assert len(table.twins) == 14  # 13 uct-1 twins at 32, 40, ..., 128 plus the 256 one


# -- rank symmetry -------------------------------------------------------------------------


def test_every_rank_builds_the_same_table_from_the_same_config():
    config = ladder_config(F, dp_size=4)
    tables = [GraphTable.build(config, rank).descriptors for rank in range(4)]
    assert all(t == tables[0] for t in tables)


def test_a_rank_threshold_offset_makes_that_rank_generate_different_twins():
    config = HarnessConfig.of(twins="all", cudagraph_mode=F, capture_sizes=(32, 64),
                              max_num_reqs=64, decode_threshold=32, threshold_offset_rank=1,
                              threshold_offset=32)
    twin32 = D(F, 32, 32, uniform_token_count=1, num_ubatches=2)
    twin64 = D(F, 64, 64, uniform_token_count=1, num_ubatches=2)
    assert GraphTable.build(config, 0).twins == (twin32, twin64)
    assert GraphTable.build(config, 1).twins == (twin64,)
