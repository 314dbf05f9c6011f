"""Per-rank batches: construction, the make_dummy layout (docs/spec.md §2.4) and validation."""

from __future__ import annotations

import pytest

from harness.batch import RankBatch, dummy_query_lens, validate_batches
from harness.config import HarnessConfig
from harness.errors import ConfigError

CONFIG = HarnessConfig.of(dp_size=2, max_num_reqs=64, max_num_batched_tokens=256)


def rejected_field(batches, config=CONFIG) -> str:
    with pytest.raises(ConfigError) as info:
        validate_batches(config, batches)
    return info.value.field


# -- RankBatch.from_query_lens -------------------------------------------------------------


def test_a_batch_of_single_token_requests_is_a_uniform_decode():
    batch = RankBatch.from_query_lens([1, 1, 1, 1])
    assert batch == RankBatch(4, 4, 1, True, (1, 1, 1, 1))
    assert batch.max_query_len == 1


def test_a_batch_with_a_prefill_has_no_uniform_token_count_and_no_query_len_bound():
    batch = RankBatch.from_query_lens([1, 7, 1])
    assert (batch.num_tokens, batch.num_reqs, batch.uniform_token_count) == (9, 3, None)
    assert batch.max_query_len is None  # vLLM's runner sends None for a batch with a prefill
    assert batch.request_query_lens() == (1, 7, 1)


def test_draft_tokens_bound_a_decode_batch_by_its_longest_request():
    mixed = RankBatch.from_query_lens([1, 3, 2], decode_query_len=3)
    assert (mixed.uniform_token_count, mixed.max_query_len) == (None, 3)
    short = RankBatch.from_query_lens([2, 2], decode_query_len=3)
    assert (short.uniform_token_count, short.max_query_len) == (2, 2)
    prefill = RankBatch.from_query_lens([1, 4], decode_query_len=3)
    assert (prefill.uniform_token_count, prefill.max_query_len) == (None, None)


def test_equal_multi_token_requests_are_prefill_chunks_not_a_uniform_decode():
    assert RankBatch.from_query_lens([3, 3]).uniform_token_count is None


def test_an_empty_batch_has_no_uniform_token_count():
    batch = RankBatch.from_query_lens([])
    assert (batch.num_tokens, batch.num_reqs, batch.uniform_token_count) == (0, 0, None)


def test_a_batch_carries_its_vote_on_microbatching():
    assert RankBatch.from_query_lens([1, 1], allow_ubatching=False).allow_ubatching is False


# -- RankBatch.uniform ---------------------------------------------------------------------


def test_a_uniform_batch_defaults_to_one_request_per_token():
    batch = RankBatch.uniform(16)
    assert (batch.num_tokens, batch.num_reqs, batch.uniform_token_count) == (16, 16, 1)
    assert batch.request_query_lens() == (1,) * 16
    assert batch.max_query_len == 1


def test_a_uniform_batch_with_two_tokens_per_request_has_half_as_many_requests():
    batch = RankBatch.uniform(16, 2)
    assert (batch.num_reqs, batch.uniform_token_count) == (8, 2)


def test_a_mixed_batch_given_by_counts_spreads_tokens_like_a_dummy_batch():
    batch = RankBatch.uniform(10, None, num_reqs=4)
    assert (batch.num_tokens, batch.num_reqs, batch.uniform_token_count) == (10, 4, None)
    assert batch.request_query_lens() == (2, 2, 3, 3)
    assert RankBatch.uniform(64, None, num_reqs=8).request_query_lens() == (8,) * 8


def test_an_idle_rank_has_no_requests():
    batch = RankBatch.uniform(0)
    assert (batch.num_tokens, batch.num_reqs, batch.uniform_token_count) == (0, 0, None)
    assert batch.request_query_lens() == ()


# -- dummy_query_lens ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_reqs", "num_tokens", "expected"),
    [
        (4, 8, (2, 2, 2, 2)),
        (4, 10, (2, 2, 3, 3)),
        (5, 7, (1, 1, 1, 2, 2)),
        (3, 11, (3, 4, 4)),
        (3, 3, (1, 1, 1)),
        (1, 32, (32,)),
        (0, 0, ()),
    ],
)
def test_the_last_requests_of_a_dummy_batch_take_the_remainder(num_reqs, num_tokens, expected):
    assert dummy_query_lens(num_reqs, num_tokens) == expected


# -- validate_batches ----------------------------------------------------------------------


def test_legal_batches_pass_validation():
    validate_batches(CONFIG, [RankBatch.uniform(64), RankBatch.from_query_lens([200, 1, 55])])
    validate_batches(CONFIG, [RankBatch.uniform(0), RankBatch.uniform(256, None, num_reqs=64)])


def test_a_negative_token_count_is_rejected():
    assert rejected_field([RankBatch(-1, 0, None), RankBatch.uniform(4)]) == "tokens"


def test_a_negative_request_count_is_rejected():
    assert rejected_field([RankBatch.uniform(4), RankBatch(4, -1, None)]) == "reqs"


@pytest.mark.parametrize("num_batches", [1, 3])
def test_there_must_be_one_batch_per_dp_rank(num_batches):
    assert rejected_field([RankBatch.uniform(4)] * num_batches) == "tokens"


def test_more_requests_than_tokens_is_rejected():
    assert rejected_field([RankBatch(2, 3, None), RankBatch.uniform(4)]) == "reqs"


@pytest.mark.parametrize(("num_tokens", "num_reqs"), [(0, 2), (4, 0)])
def test_tokens_without_requests_or_requests_without_tokens_are_rejected(num_tokens, num_reqs):
    assert rejected_field([RankBatch(num_tokens, num_reqs, None), RankBatch.uniform(4)]) == "reqs"


@pytest.mark.parametrize(
    ("num_tokens", "num_reqs", "uct"), [(10, 4, 2), (8, 4, 1), (4, 4, 0)],
)
def test_a_uniform_token_count_that_does_not_match_the_counts_is_rejected(num_tokens, num_reqs,
                                                                          uct):
    batch = RankBatch(num_tokens, num_reqs, uct)
    assert rejected_field([RankBatch.uniform(4), batch]) == "uct"


def test_more_tokens_than_the_token_budget_is_rejected():
    batch = RankBatch.uniform(257, None, num_reqs=8)
    assert rejected_field([batch, RankBatch.uniform(4)]) == "tokens"


def test_more_requests_than_max_num_reqs_is_rejected():
    assert rejected_field([RankBatch.uniform(65), RankBatch.uniform(4)]) == "reqs"
    validate_batches(CONFIG, [RankBatch.uniform(64), RankBatch.uniform(4)])


def test_a_request_without_tokens_is_rejected():
    batch = RankBatch(2, 2, None, True, (2, 0))
    assert rejected_field([RankBatch.uniform(4), batch]) == "query_lens"


def test_a_validation_error_names_the_offending_rank():
    with pytest.raises(ConfigError, match="rank 1"):
        validate_batches(CONFIG, [RankBatch.uniform(4), RankBatch.uniform(65)])
