"""A rank's persistent step buffers and the per-microbatch views the forward runs on.

All shapes are fixed at allocation and refreshed in place, so a graph captured over them
stays valid; a microbatch is a token slice plus a request slice with its own
query_start_loc/seq_lens buffers (docs/spec.md §4.4, §5.4).
"""

from __future__ import annotations

import array
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harness.bug_switches import Continuation
from harness.model.state import RequestSpec
from harness.model.ubatch_slice import UbatchSlice
from harness.model.weights import DTYPE


def int64_tensor(values: list[int]) -> torch.Tensor:
    """A host int64 tensor of `values`, through an array: 4x faster than torch.tensor on a
    list (measured on a step's ~450 ints), which converts item by item."""
    return torch.frombuffer(array.array("q", values), dtype=torch.int64)


class StepBuffers:
    """One rank's step inputs and output, allocated once and refreshed in place.

    T = num_tokens and R = num_reqs are fixed by the shapes; real tokens come first and the
    rest is padding; padded requests have query length 0, seq_len 0 and the scratch slot.
    """

    def __init__(self, num_tokens: int, num_reqs: int, hidden_size: int,
                 scratch_slot: int, device: torch.device | str = "cpu") -> None:
        self.scratch_slot = scratch_slot
        i64 = {"dtype": torch.int64, "device": device}
        self.input_ids = torch.zeros(num_tokens, **i64)
        self.positions = torch.zeros(num_tokens, **i64)
        self.is_padding = torch.ones(num_tokens, dtype=torch.bool, device=device)
        self.query_start_loc = torch.zeros(num_reqs + 1, **i64)
        self.seq_lens = torch.zeros(num_reqs, **i64)
        self.slot_ids = torch.full((num_reqs,), scratch_slot, **i64)
        # Tokens of each request already cached before this step (vLLM's num_computed_tokens).
        self.computed = torch.zeros(num_reqs, **i64)
        self.output = torch.zeros(num_tokens, hidden_size, dtype=DTYPE, device=device)
        self.real_tokens: int | None = None  # of the last batch filled in, known on the host

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_reqs(self) -> int:
        return self.seq_lens.shape[0]

    def whole(self) -> UbatchSlice:
        return UbatchSlice(0, self.num_reqs, 0, self.num_tokens)

    def fill(self, requests: Sequence[RequestSpec], pad_token_id: int = 0,
             pad_position: int = 0) -> int:
        """Write a batch into the buffers in place (host-built, copied to the buffers'
        device); returns its real token count."""
        ids: list[int] = []
        positions: list[int] = []
        starts, seq_lens, slots, computed = [0], [], [], []
        for r in requests:  # one pass, no per-request property calls: a step's hot path
            context, q = r.context_len, len(r.token_ids)
            ids += r.token_ids
            positions += range(context, context + q)
            starts.append(starts[-1] + q)
            seq_lens.append(context + q)
            slots.append(r.slot)
            computed.append(context)
        n, m = len(ids), len(requests)
        if n > self.num_tokens or m > self.num_reqs:
            raise ValueError(f"batch of {n} tokens / {m} requests exceeds buffers of "
                             f"{self.num_tokens} / {self.num_reqs}")
        pad, idle = self.num_tokens - n, self.num_reqs - m
        # Every field in one host tensor, then one copy per buffer (the padding flags as 0/1,
        # which copy_ turns into bools).
        host = int64_tensor(ids + [pad_token_id] * pad + positions + [pad_position] * pad
                            + [0] * n + [1] * pad + starts + [n] * idle + seq_lens + [0] * idle
                            + slots + [self.scratch_slot] * idle + computed + [0] * idle)
        t, r = self.num_tokens, self.num_reqs
        parts = host.split([t, t, t, r + 1, r, r, r])
        for buffer, part in zip((self.input_ids, self.positions, self.is_padding,
                                 self.query_start_loc, self.seq_lens, self.slot_ids,
                                 self.computed), parts, strict=True):
            buffer.copy_(part)
        self.real_tokens = n
        return n


class UbatchMetadata:
    """One microbatch's own persistent request metadata (all microbatches are live at once)."""

    def __init__(self, max_num_reqs: int, device: torch.device | str = "cpu") -> None:
        self.query_start_loc = torch.zeros(max_num_reqs + 1, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(max_num_reqs, dtype=torch.int64, device=device)
        # Per request, its tokens cached before the microbatch's first token: the step's
        # count plus, for a request continued from an earlier microbatch, its tokens there.
        self.computed = torch.zeros(max_num_reqs, dtype=torch.int64, device=device)
        # The storage start-up captures over, kept alive: under the rebind slip a real CUDA
        # graph then reads an earlier run's counts, as an emulated one does, not freed memory.
        self.captured_computed = self.computed


@dataclass(frozen=True)
class Microbatch:
    """What the forward of one microbatch reads and writes: views plus its metadata."""

    ubatch_id: int
    tok_start: int  # where the token slice starts in the rank's step (for provenance)
    input_ids: torch.Tensor
    positions: torch.Tensor
    is_padding: torch.Tensor
    query_start_loc: torch.Tensor  # [R_m + 1], rebased to the token slice
    seq_lens: torch.Tensor  # [R_m]
    slot_ids: torch.Tensor  # [R_m]
    output: torch.Tensor  # [T_m, H]
    computed: torch.Tensor  # [R_m]: per request, tokens cached before this microbatch
    real_tokens: int | None = None  # its unpadded tokens, when the host knows them

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]


def prepare_microbatch(step: StepBuffers, meta: UbatchMetadata, sl: UbatchSlice,
                       ubatch_id: int = 0, *, continuation: Continuation = Continuation.COUNTED,
                       rebind_lookback: bool = False) -> Microbatch:
    """Rewrite `meta` for the slice (tensor ops only) and return the microbatch's views.

    query_start_loc is rebased and clamped into the token slice; the last request's seq_len
    is shortened by its tokens that lie past the slice (docs/spec.md §4.4 step 3), and each
    request's cached count grows by its tokens before the slice (step 4). The two switches
    plant vLLM #56031 (`continuation` stale) and #56440 (`rebind_lookback`, docs/spec.md
    §7.18-7.19).
    """
    if sl.is_empty():
        raise ValueError(f"empty microbatch slice {sl}")
    num_reqs = sl.req_stop - sl.req_start
    starts = step.query_start_loc[sl.req_start:sl.req_stop + 1]
    qsl = meta.query_start_loc[:num_reqs + 1]
    qsl.copy_((starts - sl.tok_start).clamp(0, sl.num_tokens))
    seq_lens = meta.seq_lens[:num_reqs]
    seq_lens.copy_(step.seq_lens[sl.req_start:sl.req_stop])
    past = (step.query_start_loc[sl.req_stop] - sl.tok_stop).clamp(min=0)
    seq_lens[num_reqs - 1:].sub_(past)
    if rebind_lookback:
        # The slip: fresh storage each time, so a graph captured over the old keeps reading it.
        meta.computed = torch.empty_like(meta.computed)
    computed = meta.computed[:num_reqs]
    computed.copy_(step.computed[sl.req_start:sl.req_stop])
    if continuation is Continuation.COUNTED:
        computed.add_((sl.tok_start - starts[:-1]).clamp(min=0))
    tokens = slice(sl.tok_start, sl.tok_stop)
    real = (None if step.real_tokens is None
            else max(0, min(sl.tok_stop, step.real_tokens) - sl.tok_start))
    return Microbatch(ubatch_id, sl.tok_start, step.input_ids[tokens], step.positions[tokens],
                      step.is_padding[tokens], qsl, seq_lens,
                      step.slot_ids[sl.req_start:sl.req_stop], step.output[tokens], computed,
                      real)
