"""Splitting a padded step into microbatches (docs/spec.md §4).

Token regions are fixed by the padded size alone: k - 1 regions of `padded // k` tokens and a
last one that absorbs the remainder and all padding. Request slices follow from where the
real requests fall, which is why a replay only reproduces the captured request split when
the real tokens reach far enough (invariant 15).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import accumulate

from harness.batch import dummy_query_lens
from harness.history.decision import GraphDescriptor, Region
from harness.model.ubatch_slice import UbatchSlice


def region_bounds(num_tokens_padded: int, num_ubatches: int) -> tuple[tuple[int, int], ...]:
    split = num_tokens_padded // num_ubatches
    starts = [split * i for i in range(num_ubatches)]
    ends = starts[1:] + [num_tokens_padded]
    return tuple(zip(starts, ends, strict=True))


def regions(num_tokens_padded: int, real_tokens: int, num_ubatches: int) -> tuple[Region, ...]:
    return tuple(Region(end - start, max(0, min(end, real_tokens) - start))
                 for start, end in region_bounds(num_tokens_padded, num_ubatches))


def padded_ubatch_slices(query_lens: Sequence[int], num_tokens_padded: int,
                         num_reqs_padded: int, num_ubatches: int) -> tuple[UbatchSlice, ...]:
    """vLLM's maybe_create_ubatch_slices, padded version, unclamped (the eager-era slicer).

    The last slice absorbs all padding; a middle slice past the real tokens is left as is
    (inverted or pointing past the last request), which the clamp only repairs in part.
    """
    cu = [0, *accumulate(query_lens)]
    real_total = cu[-1]
    split = num_tokens_padded // num_ubatches
    starts = [split * i for i in range(num_ubatches)]
    ends = starts[1:] + [real_total]
    slices = [UbatchSlice(bisect_right(cu, start) - 1, bisect_left(cu, end), start, end)
              for start, end in zip(starts, ends, strict=True)]
    last = slices[-1]
    slices[-1] = UbatchSlice(last.req_start, num_reqs_padded, last.tok_start, num_tokens_padded)
    assert sum(s.num_tokens for s in slices) == num_tokens_padded
    return tuple(slices)


def clamped_ubatch_slices(query_lens: Sequence[int], num_tokens_padded: int,
                          num_reqs_padded: int, num_ubatches: int) -> tuple[UbatchSlice, ...]:
    """The PR-merge slicer: padded slices with every request slice clamped into the batch.

    An all-padding microbatch thus holds the last real request with zero query tokens.
    """
    last_real = max(len(query_lens) - 1, 0)
    return tuple(UbatchSlice(min(s.req_start, last_real), min(s.req_stop, num_reqs_padded),
                             s.tok_start, s.tok_stop)
                 for s in padded_ubatch_slices(query_lens, num_tokens_padded, num_reqs_padded,
                                               num_ubatches))


def captured_split(desc: GraphDescriptor, max_num_reqs: int) -> tuple[UbatchSlice, ...]:
    """The split a microbatched FULL graph freezes at capture: that of its dummy batch."""
    num_reqs = desc.num_reqs or min(desc.num_tokens, max_num_reqs)
    lens = dummy_query_lens(num_reqs, desc.num_tokens)
    return clamped_ubatch_slices(lens, desc.num_tokens, num_reqs, desc.num_ubatches)
