"""Adaptive verification's trimmed drafts (docs/spec.md §1.6, §7.24): the stand-in for the
device's allocation of the draft budget, the host's even layout, the rank field that carries
the untrimmed counts, and the split that must count requests by the tokens that run."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.batch import RankBatch
from harness.config import HarnessConfig
from harness.errors import ConfigError
from harness.gen.verify_budget import CONFIDENCES, admitted_drafts, verified_layout
from harness.scenario import scenario_from_dict
from harness.sut.slicing import clamped_ubatch_slices

VERIFYING = {"decode_query_len": 4, "varlen_decode": True, "cudagraph_mode": "FULL_AND_PIECEWISE",
             "capture_sizes": [8, 16], "max_num_reqs": 8, "max_num_batched_tokens": 64}


def test_the_budget_goes_to_the_drafts_most_likely_to_survive():
    confidences = [[0.9, 0.9, 0.3], [1.0, 0.3, 1.0], [0.6, 1.0, 1.0]]
    # Survival: r0 .9 .81 .243, r1 1 .3 .3, r2 .6 .6 .6 -> the best four: r1s0, r0s0, r0s1, r2s0
    assert admitted_drafts([3, 3, 3], 4, confidences) == (2, 1, 1)
    assert admitted_drafts([3, 3, 3], 0, confidences) == (0, 0, 0)
    assert admitted_drafts([3, 3, 3], 99, confidences) == (3, 3, 3)


@given(st.lists(st.integers(0, 3), min_size=1, max_size=6), st.integers(0, 20), st.data())
def test_each_request_keeps_a_prefix_of_its_drafts_and_the_budget_is_spent(drafts, budget, data):
    confidences = [[data.draw(st.sampled_from(CONFIDENCES)) for _ in range(d)] for d in drafts]
    kept = admitted_drafts(drafts, budget, confidences)
    assert sum(kept) == min(budget, sum(drafts))
    assert all(0 <= k <= d for k, d in zip(kept, drafts, strict=True))


def test_the_host_spreads_the_budget_evenly_over_the_verifying_requests():
    batch = RankBatch.from_query_lens((1, 1, 2), decode_query_len=4, scheduled_lens=(4, 4, 4))
    assert batch.host_lens() == (2, 1, 1)  # one draft kept: the host gives it to the first
    assert batch.slicing_lens() == (4, 4, 4)
    plain = RankBatch.from_query_lens((2, 2), decode_query_len=4)
    assert plain.host_lens() == plain.slicing_lens() == (2, 2)


def test_cutting_by_the_untrimmed_counts_leaves_a_token_outside_its_microbatchs_requests():
    by_scheduled = clamped_ubatch_slices((4, 4, 4), 4, 3, 2)
    assert [(s.req_start, s.req_stop, s.tok_start, s.tok_stop) for s in by_scheduled][0] == \
        (0, 1, 0, 2)  # tokens 0 and 1 run, request 1 (token 1) is not in the slice
    by_run = clamped_ubatch_slices((1, 1, 2), 4, 3, 2)
    assert (by_run[0].req_start, by_run[0].req_stop) == (0, 2)


@pytest.mark.parametrize("rank, field, says", [
    ({"query_lens": [1, 2], "scheduled_lens": [4]}, "scheduled_lens", "lists 1 requests"),
    ({"query_lens": [3, 2], "scheduled_lens": [2, 2]}, "scheduled_lens", "only a decode"),
    ({"query_lens": [5, 2], "scheduled_lens": [6, 2]}, "scheduled_lens", "only a decode"),
    ({"tokens": 2, "scheduled_lens": [4, 4]}, "ranks[0].scheduled_lens", "beside"),
    ({"query_lens": [1], "scheduled_lens": "4"}, "ranks[0].scheduled_lens", "list"),
])
def test_a_bad_scheduled_count_is_refused_naming_the_field(rank, field, says):
    with pytest.raises(ConfigError) as error:
        scenario_from_dict({"config": VERIFYING, "steps": [{"ranks": [rank, {"tokens": 2}]}]})
    assert error.value.field.endswith(field) and says in str(error.value)


def test_trimmed_drafts_need_adaptive_verification_and_survive_a_round_trip():
    rank = {"query_lens": [1, 1], "scheduled_lens": [1, 4]}
    with pytest.raises(ConfigError) as error:
        scenario_from_dict({"config": {**VERIFYING, "varlen_decode": False},
                            "steps": [{"ranks": [rank, {"tokens": 2}]}]})
    assert "varlen_decode" in str(error.value)
    scenario = scenario_from_dict({"config": VERIFYING, "steps": [{"ranks": [rank, 2]}]})
    assert scenario.to_dict()["steps"][0]["ranks"][0] == rank  # never the `tokens` shorthand
    assert scenario_from_dict(scenario.to_dict()) == scenario


@given(st.data())
def test_a_drawn_verified_layout_runs_its_count_and_scheduled_more_within_the_limit(data):
    config = HarnessConfig.of(**VERIFYING)
    count = data.draw(st.integers(0, 64))
    drawn = data.draw(verified_layout(config, count))
    if drawn is None:  # none fits: no token, more than 8 requests of 4, or no room to trim
        assert count == 0 or count >= 8 * 4 or count == 64
        return
    lens, scheduled = drawn
    assert sum(lens) == count < sum(scheduled) <= 64
    assert all(1 <= q <= s <= 4 for q, s in zip(lens, scheduled, strict=True))
