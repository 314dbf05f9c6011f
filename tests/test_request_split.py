"""0.34's request-boundary split (docs/spec.md §4.1): a uniform batch of q > 1 token requests
is cut between requests, in the miniature's slicer, its plans and guard, and the spec; and the
checkers that judge the split a rank ran (no_empty_region on the bounds run,
tokens_in_their_requests)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from record_builders import step_records

from harness.batch import RankBatch
from harness.check.checkers import check_no_empty_region
from harness.check.token_cover import check_tokens_in_their_requests, misplaced_token
from harness.check.verdict import Outcome
from harness.config import HarnessConfig
from harness.history.records import StepRecord
from harness.spec.decision import last_region_start as spec_last_region_start
from harness.spec.decision import spec_plans
from harness.sut.slicing import clamped_ubatch_slices, region_bounds, split_size
from harness.sut.step_plan import plan_without_world
from harness.sut.thresholds import last_region_start


def drafts_split(release: str = "0.34", **changes) -> HarnessConfig:
    fields = {"dp_size": 2, "decode_query_len": 3, "cudagraph_mode": "FULL_AND_PIECEWISE",
              "capture_sizes": (9, 15, 24), "max_num_reqs": 8, "max_num_batched_tokens": 64,
              "decode_threshold": 4, "prefill_threshold": 16, "release": release}
    return HarnessConfig.of(**{**fields, **changes})


def uniform(reqs: int, q: int = 3) -> RankBatch:
    return RankBatch.from_query_lens((q,) * reqs, decode_query_len=q)


def test_a_uniform_split_cuts_between_requests_and_the_last_region_takes_the_rest():
    assert split_size(24, 2, 3) == 12 and region_bounds(24, 2, 3) == ((0, 12), (12, 24))
    assert region_bounds(15, 2, 3) == ((0, 6), (6, 15))  # 5 requests: 2 and 3, not 7 / 8
    assert region_bounds(27, 3, 3) == ((0, 9), (9, 18), (18, 27))
    assert region_bounds(15, 2) == ((0, 7), (7, 15))  # no query length: half the tokens
    assert region_bounds(15, 2, 1) == ((0, 7), (7, 15))
    assert region_bounds(5, 2, 3) == ((0, 2), (2, 5))  # no whole request fits a region


@given(st.integers(1, 300), st.integers(2, 4), st.integers(2, 5))
def test_every_region_but_the_last_holds_whole_requests_whenever_one_fits(padded, k, q):
    bounds = region_bounds(padded, k, q)
    assert bounds[0][0] == 0 and bounds[-1][1] == padded
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    if padded >= q * k:
        assert all(end % q == 0 for _, end in bounds[:-1])
        assert bounds[-1][1] - bounds[-1][0] >= bounds[0][1] - bounds[0][0]
    assert last_region_start(padded, k, q) == spec_last_region_start(padded, k, q)


def test_the_slices_of_a_uniform_batch_hold_whole_requests_in_each_microbatch():
    slices = clamped_ubatch_slices((3,) * 5, 15, 5, 2, split_uct=3)
    assert [(s.req_start, s.req_stop, s.tok_start, s.tok_stop) for s in slices] == \
        [(0, 2, 0, 6), (2, 5, 6, 15)]


def test_the_guard_of_0_34_asks_where_the_request_split_puts_the_last_region():
    # 5 requests x 3 on the 15-token twin: the last region starts at 6, not at 7; rank 1's
    # 3 requests (9 tokens) reach it, so the twin replays on both releases' guards...
    plans = plan_without_world(drafts_split(), [uniform(5), uniform(3)])
    assert plans[1].kind == "full-microbatched"
    assert [r.real_tokens for r in plans[1].regions] == [6, 3]
    # ...and 2 requests (6 tokens) sit on its start: the fixed guard runs eager.
    plans = plan_without_world(drafts_split(), [uniform(5), uniform(2)])
    assert plans[0].kind == "eager-microbatched"


def test_the_merged_guard_replays_an_empty_last_region_of_an_even_request_count():
    # 8 requests x 3 on the 24-token twin: the split is at 12; 2 * 12 < 24 is false, so the
    # merged guard replays with rank 1's 4 requests all in the first region.
    config = drafts_split(guard="merged")
    plans = plan_without_world(config, [uniform(7), uniform(4)])
    assert plans[1].kind == "full-microbatched" and plans[1].empty_regions() == (1,)
    # The spec plants no bug: it keeps the fixed guard, an eager split.
    spec = spec_plans(config, [uniform(7), uniform(4)])
    assert spec != plans and spec[1].kind == "eager-microbatched"
    assert spec == plan_without_world(drafts_split(), [uniform(7), uniform(4)])


def test_an_eager_split_cuts_by_the_synced_query_length():
    config = drafts_split(cudagraph_mode="NONE", capture_sizes=None)
    plans = plan_without_world(config, [uniform(5), uniform(5)])
    assert [r.tokens for r in plans[0].regions] == [6, 9]
    assert plans == spec_plans(config, [uniform(5), uniform(5)])


def test_0_33_splits_by_tokens_and_the_spec_agrees():
    config = drafts_split("0.33", enable_dbo=False, decode_query_len=1, capture_sizes=(15,),
                          max_num_reqs=16)
    one_token = [RankBatch.uniform(15), RankBatch.uniform(15)]
    assert [r.tokens for r in plan_without_world(config, one_token)[0].regions] == []
    config = drafts_split("0.33", decode_query_len=1, capture_sizes=(15,), max_num_reqs=16)
    assert [r.tokens for r in plan_without_world(config, one_token)[0].regions] == [7, 8]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.integers(1, 8), st.sampled_from(["fixed", "merged"]),
       st.sampled_from([2, 3]))
def test_the_miniature_and_the_spec_plan_every_uniform_draft_step_alike(a, b, guard, k):
    # ...the miniature with the fixed guard: the spec plans no guard of a planted bug.
    config = drafts_split(guard=guard, enable_dbo=k == 2, ubatch_size=0 if k == 2 else k,
                          decode_threshold=max(4, k), prefill_threshold=max(16, k))
    batches = [uniform(a), uniform(b)]
    fixed = config.with_changes(guard="fixed")
    assert plan_without_world(fixed, batches) == spec_plans(config, batches)


# -- the checkers, on the split a rank ran --------------------------------------------------

def _ran(rank: int, split) -> StepRecord:
    return replace(step_records(2)[rank], ran_split=tuple(split))


def test_no_empty_region_judges_the_token_bounds_the_replay_ran_not_the_plans():
    # Both ranks plan 20+ real tokens of the 32-token twin, regions [0:16] [16:32]: held.
    records = step_records(2)
    assert check_no_empty_region(records).outcome is Outcome.HELD
    # Rank 1 recorded running a split whose last region starts past its 21 real tokens.
    records[1] = replace(records[1], ran_split=((0, 24, 0, 24), (24, 32, 24, 32)))
    judged = check_no_empty_region(records)
    assert judged.outcome is Outcome.FAILED and "rank 1" in judged.detail
    assert "(24, 32)" in judged.detail


def test_no_empty_region_is_not_applicable_where_no_rank_replays_a_split_graph():
    config = drafts_split(cudagraph_mode="NONE", capture_sizes=None)
    plans = plan_without_world(config, [uniform(5), uniform(1)])
    records = [replace(r, plan=p, executed="eager-microbatched")
               for r, p in zip(step_records(2), plans, strict=True)]
    assert check_no_empty_region(records).outcome is Outcome.NOT_APPLICABLE


def test_tokens_in_their_requests_holds_on_whole_requests_per_microbatch():
    assert misplaced_token([(0, 2, 0, 6), (2, 5, 6, 15)], (3,) * 5) is None
    # A request straddling the cut sits in both slices, its tokens in one each: legal.
    assert misplaced_token([(0, 3, 0, 7), (2, 5, 7, 15)], (3,) * 5) is None


@pytest.mark.parametrize("split, says", [
    ([(0, 2, 0, 6), (2, 5, 7, 15)], "token 6 (request 2) runs in microbatches []"),
    ([(0, 3, 0, 7), (2, 5, 6, 15)], "token 6 (request 2) runs in microbatches [0, 1]"),
    ([(0, 2, 0, 7), (2, 5, 7, 15)], "leave out its request 2"),
    ([(0, 2, 0, 6), (3, 5, 6, 15)], "leave out its request 2"),
])
def test_tokens_in_their_requests_names_a_token_run_twice_never_or_outside_its_request(
        split, says):
    assert says in misplaced_token(split, (3,) * 5)


def test_tokens_in_their_requests_judges_every_rank_and_is_not_applicable_unsplit():
    good, bad = ((0, 2, 0, 6), (2, 5, 6, 15)), ((0, 2, 0, 7), (2, 5, 7, 15))
    lens = ((3,) * 5, (3,) * 5)
    records = [_ran(0, good), _ran(1, bad)]
    judged = check_tokens_in_their_requests(records, lens)
    assert judged.outcome is Outcome.FAILED and "rank 1" in judged.detail
    records = [_ran(0, good), _ran(1, good)]
    assert check_tokens_in_their_requests(records, lens).outcome is Outcome.HELD
    whole = [_ran(r, ((0, 5, 0, 15),)) for r in range(2)]
    assert check_tokens_in_their_requests(whole, lens).outcome is Outcome.NOT_APPLICABLE
    assert check_tokens_in_their_requests(records, ()).outcome is Outcome.NOT_APPLICABLE


def test_an_idle_ranks_dummy_batch_on_a_twin_is_not_an_empty_region_but_a_busy_rank_is():
    # With drafts the idle rank's dummy batch (one request of q = 3) meets the guard on the
    # twin of 1 request x 3 tokens, cut by tokens at 1: its regions are padding by design.
    config = drafts_split(capture_sizes=(3, 6), max_num_reqs=8, decode_threshold=2,
                          prefill_threshold=4)
    plans = plan_without_world(config, [RankBatch.uniform(0), uniform(1)])
    assert [p.kind for p in plans] == ["full-microbatched"] * 2 and plans[0].real_tokens == 0
    records = [replace(r, plan=p, ran_split=((0, 1, 0, 1), (0, 1, 1, 3)))
               for r, p in zip(step_records(2), plans, strict=True)]
    assert check_no_empty_region(records).outcome is Outcome.HELD
    records[1] = replace(records[1], ran_split=((0, 1, 0, 3), (0, 1, 3, 3)))
    judged = check_no_empty_region(records)
    assert judged.outcome is Outcome.FAILED and "rank 1" in judged.detail
