"""Splitting a padded step into microbatches (docs/spec.md §4).

Token regions are fixed by the padded size (and, from 0.34, the uniform query length the split
is made by): k - 1 regions of `split_size` tokens and a last one that absorbs the remainder
and all padding. Request slices follow from where the real requests fall, which is why a
replay only reproduces the captured request split when the real tokens reach far enough
(invariant 15).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import accumulate

from harness.batch import dummy_query_lens
from harness.config import CudaGraphMode, HarnessConfig
from harness.history.decision import DpSyncState, GraphDescriptor, Region
from harness.model.ubatch_slice import UbatchSlice


def split_size(num_tokens_padded: int, num_ubatches: int, split_uct: int | None = None) -> int:
    """Tokens of every region but the last: `padded // k`, or (0.34, vLLM's
    create_ubatch_slices) whole requests of `split_uct` > 1 tokens when one fits per region."""
    if split_uct is not None and split_uct > 1:
        reqs_per_region = num_tokens_padded // (split_uct * num_ubatches)
        if reqs_per_region > 0:
            return reqs_per_region * split_uct
    return num_tokens_padded // num_ubatches


def split_uct_of(config: HarnessConfig, desc: GraphDescriptor,
                 state: DpSyncState | None) -> int | None:
    """The query length a split step is cut by: none before 0.34; from 0.34 a FULL replay
    cuts as its graph was captured (the descriptor's), an eager step by the synced one."""
    if not config.serving.release.request_boundary_split:
        return None
    if desc.cg_mode is CudaGraphMode.FULL or state is None:
        return desc.uniform_token_count
    return state.uniform_token_count


def region_bounds(num_tokens_padded: int, num_ubatches: int,
                  split_uct: int | None = None) -> tuple[tuple[int, int], ...]:
    split = split_size(num_tokens_padded, num_ubatches, split_uct)
    starts = [split * i for i in range(num_ubatches)]
    ends = starts[1:] + [num_tokens_padded]
    return tuple(zip(starts, ends, strict=True))


def regions(num_tokens_padded: int, real_tokens: int, num_ubatches: int,
            split_uct: int | None = None) -> tuple[Region, ...]:
    return tuple(Region(end - start, max(0, min(end, real_tokens) - start))
                 for start, end in region_bounds(num_tokens_padded, num_ubatches, split_uct))


def padded_ubatch_slices(query_lens: Sequence[int], num_tokens_padded: int,
                         num_reqs_padded: int, num_ubatches: int,
                         split_uct: int | None = None) -> tuple[UbatchSlice, ...]:
    """vLLM's maybe_create_ubatch_slices, padded version, unclamped (the eager-era slicer).

    The last slice absorbs all padding; a middle slice past the real tokens is left as is
    (inverted or pointing past the last request), which the clamp only repairs in part.
    """
    cu = [0, *accumulate(query_lens)]
    real_total = cu[-1]
    split = split_size(num_tokens_padded, num_ubatches, split_uct)
    starts = [split * i for i in range(num_ubatches)]
    ends = starts[1:] + [real_total]
    slices = [UbatchSlice(bisect_right(cu, start) - 1, bisect_left(cu, end), start, end)
              for start, end in zip(starts, ends, strict=True)]
    last = slices[-1]
    slices[-1] = UbatchSlice(last.req_start, num_reqs_padded, last.tok_start, num_tokens_padded)
    assert sum(s.num_tokens for s in slices) == num_tokens_padded
    return tuple(slices)


def clamped_ubatch_slices(query_lens: Sequence[int], num_tokens_padded: int,
                          num_reqs_padded: int, num_ubatches: int,
                          split_uct: int | None = None) -> tuple[UbatchSlice, ...]:
    """The PR-merge slicer: padded slices with every request slice clamped into the batch.

    An all-padding microbatch thus holds the last real request with zero query tokens.
    """
    last_real = max(len(query_lens) - 1, 0)
    return tuple(UbatchSlice(min(s.req_start, last_real), min(s.req_stop, num_reqs_padded),
                             s.tok_start, s.tok_stop)
                 for s in padded_ubatch_slices(query_lens, num_tokens_padded, num_reqs_padded,
                                               num_ubatches, split_uct))


def captured_split(desc: GraphDescriptor, max_num_reqs: int,
                   split_uct: int | None = None) -> tuple[UbatchSlice, ...]:
    """The split a microbatched FULL graph freezes at capture: that of its dummy batch."""
    num_reqs = desc.num_reqs or min(desc.num_tokens, max_num_reqs)
    lens = dummy_query_lens(num_reqs, desc.num_tokens)
    return clamped_ubatch_slices(lens, desc.num_tokens, num_reqs, desc.num_ubatches, split_uct)
