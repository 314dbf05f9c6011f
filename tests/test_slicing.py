"""Microbatch regions and request slices (docs/spec.md §4, §4.5, §7.2, §7.7)."""

from __future__ import annotations

import pytest

from harness.config import CudaGraphMode
from harness.history.decision import GraphDescriptor, Region
from harness.model.ubatch_slice import UbatchSlice
from harness.sut.slicing import (
    captured_split,
    clamped_ubatch_slices,
    padded_ubatch_slices,
    region_bounds,
    regions,
)

F = CudaGraphMode.FULL


def request_spans(slices) -> list[tuple[int, int]]:
    return [(s.req_start, s.req_stop) for s in slices]


def token_spans(slices) -> list[tuple[int, int]]:
    return [(s.tok_start, s.tok_stop) for s in slices]


def replay_split(num_real_reqs: int, clamped: bool = True) -> list[tuple[int, int]]:
    """Request slices of n one-token requests padded to 16 requests / 16 tokens, k = 2."""
    slicer = clamped_ubatch_slices if clamped else padded_ubatch_slices
    return request_spans(slicer([1] * num_real_reqs, 16, 16, 2))


# -- docs/spec.md §4.5: the captured split survives a replay with enough requests -----------


def test_the_captured_split_of_a_sixteen_request_twin_is_two_halves():
    twin = GraphDescriptor(F, 16, 16, uniform_token_count=1, num_ubatches=2)
    split = captured_split(twin, max_num_reqs=32)
    assert request_spans(split) == [(0, 8), (8, 16)]
    assert token_spans(split) == [(0, 8), (8, 16)]


@pytest.mark.parametrize("num_real_reqs", [16, 9])
def test_the_captured_split_survives_a_replay_with_enough_requests(num_real_reqs):
    assert replay_split(num_real_reqs) == [(0, 8), (8, 16)]


def test_a_replay_with_exactly_the_split_point_shifts_the_second_slice_with_the_clamp():
    # n = 8 is the equality case of docs/spec.md §7.1: the clamped slicer starts slice 2 one
    # request early; the unclamped eager-era slicer keeps [8:16].
    assert replay_split(8) == [(0, 8), (7, 16)]
    assert replay_split(8, clamped=False) == [(0, 8), (8, 16)]


def test_a_replay_with_fewer_requests_than_the_split_point_breaks_the_split():
    assert replay_split(7) == [(0, 8), (6, 16)]
    assert replay_split(4) == [(0, 5), (3, 16)]
    assert replay_split(7, clamped=False) == [(0, 8), (7, 16)]
    assert replay_split(4, clamped=False) == [(0, 5), (4, 16)]


def test_token_regions_do_not_depend_on_the_real_requests():
    for n in (16, 9, 8, 7, 4):
        assert token_spans(clamped_ubatch_slices([1] * n, 16, 16, 2)) == [(0, 8), (8, 16)]


# -- the last region absorbs the remainder and the padding ---------------------------------


def test_the_last_region_absorbs_the_remainder():
    assert region_bounds(17, 2) == ((0, 8), (8, 17))
    assert region_bounds(10, 3) == ((0, 3), (3, 6), (6, 10))
    slices = padded_ubatch_slices([1] * 10, 10, 10, 3)
    assert token_spans(slices) == [(0, 3), (3, 6), (6, 10)]
    assert request_spans(slices) == [(0, 3), (3, 6), (6, 10)]


def test_the_last_slice_absorbs_token_and_request_padding():
    # Five decodes padded to 8 tokens / 8 requests.
    slices = padded_ubatch_slices([1] * 5, 8, 8, 2)
    assert token_spans(slices) == [(0, 4), (4, 8)]
    assert request_spans(slices) == [(0, 4), (4, 8)]
    assert [s.num_tokens for s in slices] == [4, 4]


def test_a_request_straddling_the_split_appears_in_both_slices():
    slices = padded_ubatch_slices([3, 5], 8, 2, 2)
    assert request_spans(slices) == [(0, 2), (1, 2)]
    assert token_spans(slices) == [(0, 4), (4, 8)]


def test_a_single_request_dummy_batch_is_split_between_both_microbatches():
    slices = clamped_ubatch_slices([32], 32, 1, 2)
    assert request_spans(slices) == [(0, 1), (0, 1)]
    assert [s.num_tokens for s in slices] == [16, 16]


def test_an_all_padding_microbatch_holds_the_last_real_request_after_the_clamp():
    # Six decodes padded to 16 tokens, requests not padded (docs/spec.md §9.2, "no work to do").
    clamped = clamped_ubatch_slices([1] * 6, 16, 6, 2)
    assert request_spans(clamped) == [(0, 6), (5, 6)]
    assert not clamped[1].is_empty()
    unclamped = padded_ubatch_slices([1] * 6, 16, 6, 2)
    assert request_spans(unclamped) == [(0, 7), (6, 6)]
    assert unclamped[1].is_empty()


def test_a_trailing_microbatch_takes_the_padded_requests():
    # Six decodes padded to 8 requests / 8 tokens: the second microbatch has requests 4..7.
    slices = clamped_ubatch_slices([1] * 6, 8, 8, 2)
    assert request_spans(slices) == [(0, 4), (4, 8)]


def test_a_slice_without_tokens_or_requests_is_empty():
    assert UbatchSlice(2, 4, 8, 8).is_empty()
    assert UbatchSlice(4, 4, 8, 16).is_empty()
    assert not UbatchSlice(3, 4, 8, 9).is_empty()
    assert UbatchSlice(3, 4, 8, 16).num_tokens == 8


# -- regions and real tokens ---------------------------------------------------------------


def test_two_regions_count_the_real_tokens_in_each():
    assert regions(128, 64, 2) == (Region(64, 64), Region(64, 0))
    assert regions(128, 65, 2) == (Region(64, 64), Region(64, 1))
    assert regions(127, 63, 2) == (Region(63, 63), Region(64, 0))
    assert region_bounds(128, 2) == ((0, 64), (64, 128))


def test_three_regions_leave_the_last_empty_when_real_tokens_stop_short():
    # Bug §7.2 of docs/spec.md: 96 tokens, k = 3, a rank with 50 real tokens.
    assert region_bounds(96, 3) == ((0, 32), (32, 64), (64, 96))
    assert regions(96, 50, 3) == (Region(32, 32), Region(32, 18), Region(32, 0))


def test_three_regions_can_leave_a_middle_region_all_padding():
    assert regions(12, 3, 3) == (Region(4, 3), Region(4, 0), Region(4, 0))


def test_a_middle_slice_past_the_real_tokens_points_past_the_real_requests():
    # docs/spec.md §7.7: k = 3, padded to 12, 3 real tokens -> slice 2 is tokens [4, 8) with the
    # request slice (3, 4), past the real requests; only the last slice is repaired.
    slices = padded_ubatch_slices([1, 1, 1], 12, 12, 3)
    assert token_spans(slices) == [(0, 4), (4, 8), (8, 12)]
    assert request_spans(slices) == [(0, 4), (3, 4), (3, 12)]
    clamped = clamped_ubatch_slices([1, 1, 1], 12, 12, 3)
    assert request_spans(clamped) == [(0, 4), (2, 4), (2, 12)]


def test_a_three_way_twin_captures_three_equal_request_slices():
    twin = GraphDescriptor(F, 96, 96, uniform_token_count=1, num_ubatches=3)
    split = captured_split(twin, max_num_reqs=128)
    assert request_spans(split) == [(0, 32), (32, 64), (64, 96)]
    assert token_spans(split) == [(0, 32), (32, 64), (64, 96)]


def test_a_two_token_twin_captures_its_requests_two_tokens_each():
    twin = GraphDescriptor(F, 8, 4, uniform_token_count=2, num_ubatches=2)
    assert request_spans(captured_split(twin, max_num_reqs=4)) == [(0, 2), (2, 4)]
