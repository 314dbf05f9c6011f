"""A miniature MoE step: attention-lite over a per-request state cache, a top-k router and
experts sharded over the DP ranks, with dispatch/combine as fixed-size all-to-alls.

Every op of `MiniMoE.forward` is a tensor op on buffers of fixed shape (no `.item()`, no
branching on values), so a graph can capture it; a microbatch is a token slice plus a request
slice with its own query_start_loc/seq_lens buffers (dbo-reference 3.3, 7).

How the known bugs (dbo-reference 12) show:
- 12.1/12.2 (replay with the captured request split): token -> request comes from the
  microbatch's query_start_loc, request -> slot from its slot_ids view, and each token reads
  its request's state plus the causal prefix; a split that disagrees with the metadata puts
  tokens into a neighbour's slot (double count), drops them (missed) or mis-scales positions.
- 12.3/12.4 (a receive hook dropped or a sibling gone): the receive is never waited, so the
  peers' bounded wait raises CollectiveTimeout, or the output rows keep stale contents.
- 12.5/12.6 (unreachable or re-captured twins) cost buffers, not rows: `reserved_buffers()`.
- 12.7 (asymmetric all-to-all): one rank's dispatch without its peers times out, bounded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from harness.config import All2AllBackend, HarnessConfig
from harness.model.overlap import MicrobatchOverlap, NoOverlap
from harness.sut.slicing import UbatchSlice

DTYPE = torch.float64
DEFAULT_VOCAB = 64
# Payload columns after the hidden vector: source rank, token index in its rank's step, expert.
SRC_COL, TOK_COL, EXPERT_COL = 0, 1, 2
NUM_PROVENANCE_COLS = 3

Wait = Callable[[], None]
# Issue `out <- all_to_all(inp)` with equal splits and return how to wait for it.
AllToAll = Callable[[torch.Tensor, torch.Tensor], Wait]


# -- weights ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class MoEWeights:
    embedding: torch.Tensor  # [V, H]
    pos_freq: torch.Tensor  # [H]
    state_proj: torch.Tensor  # [H, H]
    router: torch.Tensor  # [H, num_experts]
    w1: torch.Tensor  # [num_experts, H, F]
    w2: torch.Tensor  # [num_experts, F, H]

    @classmethod
    def build(cls, config: HarnessConfig, vocab_size: int = DEFAULT_VOCAB,
              device: torch.device | str = "cpu") -> MoEWeights:
        """Every rank draws all experts from one seeded generator (on the CPU, then moved to
        `device`), so all ranks and devices agree."""
        h, e = config.hidden_size, config.num_experts
        f = 2 * h
        gen = torch.Generator().manual_seed(config.seed)

        def draw(*shape: int, scale: float) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, dtype=DTYPE) * scale

        weights = cls(embedding=draw(vocab_size, h, scale=0.5),
                      pos_freq=draw(h, scale=0.1),
                      state_proj=draw(h, h, scale=h ** -0.5),
                      router=draw(h, e, scale=1.0),
                      w1=draw(e, h, f, scale=h ** -0.5),
                      w2=draw(e, f, h, scale=f ** -0.5))
        return weights.to(device)

    @property
    def device(self) -> torch.device:
        return self.embedding.device

    def to(self, device: torch.device | str) -> MoEWeights:
        """The same weights on `device` (self when they are there already)."""
        device = torch.device(device)
        if self.device == device:
            return self
        return MoEWeights(**{name: t.to(device) for name, t in self.tensors().items()})

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def expert_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ w1) @ w2


# -- requests and persistent buffers ----------------------------------------------------------

@dataclass(frozen=True)
class RequestSpec:
    """One scheduled request: its state-cache slot, tokens already cached, new token ids."""

    slot: int
    context_len: int
    token_ids: tuple[int, ...]

    @property
    def query_len(self) -> int:
        return len(self.token_ids)

    @property
    def seq_len(self) -> int:
        return self.context_len + self.query_len

    def positions(self) -> range:
        return range(self.context_len, self.seq_len)


class StateCache:
    """The per-request state ("KV-like"): row `slot`; row `num_slots` is a scratch slot that
    padded requests and non-real tokens are mapped to, so they never touch a real row."""

    def __init__(self, num_slots: int, hidden_size: int,
                 device: torch.device | str = "cpu") -> None:
        self.num_slots = num_slots
        self.state = torch.zeros(num_slots + 1, hidden_size, dtype=DTYPE, device=device)

    @property
    def scratch_slot(self) -> int:
        return self.num_slots


def initial_state(config: HarnessConfig, rank: int) -> torch.Tensor:
    """The state cache a rank starts from: seeded, non-zero (so a lost update shows), with a
    zero scratch row; the reference starts from the same."""
    gen = torch.Generator().manual_seed(config.seed * 1009 + rank + 1)
    state = torch.randn(config.max_num_reqs + 1, config.hidden_size, generator=gen, dtype=DTYPE)
    state[config.max_num_reqs] = 0.0
    return state


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
        self.output = torch.zeros(num_tokens, hidden_size, dtype=DTYPE, device=device)

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
        ids = [t for r in requests for t in r.token_ids]
        n, m = len(ids), len(requests)
        if n > self.num_tokens or m > self.num_reqs:
            raise ValueError(f"batch of {n} tokens / {m} requests exceeds buffers of "
                             f"{self.num_tokens} / {self.num_reqs}")
        pad = self.num_tokens - n
        self.input_ids.copy_(torch.tensor(ids + [pad_token_id] * pad, dtype=torch.int64))
        positions = [p for r in requests for p in r.positions()]
        self.positions.copy_(torch.tensor(positions + [pad_position] * pad, dtype=torch.int64))
        self.is_padding.copy_(torch.arange(self.num_tokens) >= n)
        starts = [0]
        for r in requests:
            starts.append(starts[-1] + r.query_len)
        starts += [n] * (self.num_reqs - m)
        self.query_start_loc.copy_(torch.tensor(starts, dtype=torch.int64))
        self.seq_lens.copy_(torch.tensor([r.seq_len for r in requests]
                                         + [0] * (self.num_reqs - m), dtype=torch.int64))
        self.slot_ids.copy_(torch.tensor([r.slot for r in requests]
                                         + [self.scratch_slot] * (self.num_reqs - m),
                                         dtype=torch.int64))
        return n


class UbatchMetadata:
    """One microbatch's own persistent request metadata (all microbatches are live at once)."""

    def __init__(self, max_num_reqs: int, device: torch.device | str = "cpu") -> None:
        self.query_start_loc = torch.zeros(max_num_reqs + 1, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(max_num_reqs, dtype=torch.int64, device=device)


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

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]


def prepare_microbatch(step: StepBuffers, meta: UbatchMetadata, sl: UbatchSlice,
                       ubatch_id: int = 0) -> Microbatch:
    """Rewrite `meta` for the slice (tensor ops only) and return the microbatch's views.

    query_start_loc is rebased and clamped into the token slice; the last request's seq_len
    is shortened by its tokens that lie past the slice (dbo-reference 3.3 step 4).
    """
    if sl.is_empty():
        raise ValueError(f"empty microbatch slice {sl}")
    num_reqs = sl.req_stop - sl.req_start
    qsl = meta.query_start_loc[:num_reqs + 1]
    qsl.copy_((step.query_start_loc[sl.req_start:sl.req_stop + 1] - sl.tok_start)
              .clamp(0, sl.num_tokens))
    seq_lens = meta.seq_lens[:num_reqs]
    seq_lens.copy_(step.seq_lens[sl.req_start:sl.req_stop])
    past = (step.query_start_loc[sl.req_stop] - sl.tok_stop).clamp(min=0)
    seq_lens[num_reqs - 1:].sub_(past)
    tokens = slice(sl.tok_start, sl.tok_stop)
    return Microbatch(ubatch_id, sl.tok_start, step.input_ids[tokens], step.positions[tokens],
                      step.is_padding[tokens], qsl, seq_lens,
                      step.slot_ids[sl.req_start:sl.req_stop], step.output[tokens])


# -- communication ----------------------------------------------------------------------------

@dataclass(frozen=True)
class CommBuffers:
    """Fixed-size dispatch/combine buffers of one microbatch: every peer block holds a count
    row and `capacity` payload rows; the send and combine-receive buffers have a trailing
    dump row where non-routed (token, k) pairs go."""

    peers: int
    capacity: int
    dispatch_send: torch.Tensor  # [P*(C+1) + 1, W]
    dispatch_recv: torch.Tensor  # [P*(C+1), W]
    combine_send: torch.Tensor  # [P*(C+1), W]
    combine_recv: torch.Tensor  # [P*(C+1) + 1, W]

    @classmethod
    def allocate(cls, peers: int, capacity: int, width: int,
                 device: torch.device | str = "cpu") -> CommBuffers:
        rows = peers * (capacity + 1)

        def zeros(n: int) -> torch.Tensor:
            return torch.zeros(n, width, dtype=DTYPE, device=device)

        return cls(peers, capacity, zeros(rows + 1), zeros(rows), zeros(rows), zeros(rows + 1))

    @property
    def rows(self) -> int:
        return self.peers * (self.capacity + 1)


@dataclass(frozen=True)
class DispatchHandle:
    flat_index: torch.Tensor  # [T*K]: row of each (token, k) pair in the send buffer
    buffers: CommBuffers


# -- the model --------------------------------------------------------------------------------

class MiniMoE:
    """One attention-lite + MoE layer on rank `rank`, which owns experts [rank*E, (rank+1)*E).

    Everything it allocates (weights, comm buffers, temporaries) lives on `device`; by
    default the device of `weights` when given, else the CPU."""

    def __init__(self, config: HarnessConfig, rank: int, all_to_all: AllToAll,
                 weights: MoEWeights | None = None,
                 device: torch.device | str | None = None) -> None:
        self.config = config
        self.rank = rank
        self.all_to_all = all_to_all
        if device is None:
            device = weights.device if weights is not None else "cpu"
        self.device = torch.device(device)
        self.weights = (weights.to(self.device) if weights is not None
                        else MoEWeights.build(config, device=self.device))
        self.hidden_size = config.hidden_size
        self.top_k = config.top_k
        self.peers = config.dp_size
        self.experts_per_rank = config.experts_per_rank
        self.width = self.hidden_size + NUM_PROVENANCE_COLS
        # DeepEP low-latency style: a fixed max tokens per rank, so every rank sends the same
        # sizes whatever its own batch (an idle or unpadded rank included).
        self.capacity = config.max_num_batched_tokens * config.top_k
        self.blocking_all_to_all = config.all2all_backend is All2AllBackend.HIGH_THROUGHPUT
        self._buffers: dict[tuple[int, int], CommBuffers] = {}
        self._lock = threading.Lock()

    # -- buffers ---------------------------------------------------------------------------

    def reserve(self, ubatch_id: int, num_tokens: int) -> CommBuffers:
        """The comm buffers of microbatch `ubatch_id` at `num_tokens` (allocated on first use;
        call before a capture so the capture allocates nothing)."""
        key = (ubatch_id, num_tokens)
        with self._lock:
            if key not in self._buffers:
                self._buffers[key] = CommBuffers.allocate(self.peers, self.capacity, self.width,
                                                          self.device)
            return self._buffers[key]

    def reserved_buffers(self) -> dict[tuple[int, int], CommBuffers]:
        with self._lock:
            return dict(self._buffers)

    def received_routes(self, ubatch_id: int, num_tokens: int) -> list[tuple[int, int, int]]:
        """(source rank, token index, expert) of every row the last dispatch delivered here.
        Reads the buffers on the host: for checks after a step, never inside one."""
        bufs = self.reserve(ubatch_id, num_tokens)
        recv = bufs.dispatch_recv.view(bufs.peers, bufs.capacity + 1, self.width).cpu()
        routes = []
        for block in recv:
            count = int(block[0, 0].item())
            for row in block[1:1 + count, self.hidden_size:].to(torch.int64).tolist():
                routes.append((row[SRC_COL], row[TOK_COL], row[EXPERT_COL]))
        return routes

    # -- forward ---------------------------------------------------------------------------

    def forward(self, mb: Microbatch, cache: StateCache,
                overlap: MicrobatchOverlap | None = None) -> None:
        """Run the microbatch and write its rows into `mb.output`; updates `cache` in place."""
        overlap = overlap if overlap is not None else NoOverlap(mb.ubatch_id)
        with torch.no_grad():
            hidden, real = self.attention(mb, cache)
            topk_weights, topk_ids = self.route(hidden, real)
            handle, expert_in = self._prepare(hidden, topk_ids, mb.tok_start, overlap)
            expert_out = self._experts(expert_in, handle.buffers)
            moe_out = self._finalize(expert_out, handle, topk_weights, overlap)
            mb.output.copy_(hidden + moe_out)

    def attention(self, mb: Microbatch, cache: StateCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal attention-lite: each real token reads its request's cached state plus the
        embeddings of the request's earlier tokens in this slice, scaled by the position the
        metadata implies; then the request's state absorbs its tokens' embeddings."""
        w = self.weights
        num_tokens, num_reqs = mb.input_ids.shape[0], mb.slot_ids.shape[0]
        qsl = mb.query_start_loc
        tok = torch.arange(num_tokens, device=mb.input_ids.device)
        req = torch.searchsorted(qsl[1:], tok, right=True)
        req_c = req.clamp(max=num_reqs - 1)
        start = qsl[req_c]
        real = (req < num_reqs) & (tok >= start) & ~mb.is_padding
        slot = torch.where(real, mb.slot_ids[req_c], cache.scratch_slot)
        emb = w.embedding[mb.input_ids]
        contrib = emb * real.unsqueeze(1)
        before = contrib.cumsum(0) - contrib
        prefix = before - before[start.clamp(max=num_tokens - 1)]
        context = cache.state[slot] + prefix
        implied_pos = mb.seq_lens[req_c] - (qsl[req_c + 1] - tok)
        scale = 1.0 / (implied_pos.clamp(min=0).to(DTYPE) + 1.0)
        hidden = (emb + torch.sin(mb.positions.to(DTYPE).unsqueeze(1) * w.pos_freq)
                  + torch.tanh((context @ w.state_proj) * scale.unsqueeze(1)))
        cache.state.index_add_(0, slot, contrib)
        return hidden, real

    def route(self, hidden: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k over all experts; non-real tokens get expert -1 and weight 0 (never sent)."""
        logits = hidden @ self.weights.router
        values, ids = logits.topk(self.top_k, dim=-1)
        weights = torch.softmax(values, dim=-1) * real.unsqueeze(1)
        return weights, torch.where(real.unsqueeze(1), ids, -1)

    def _prepare(self, hidden: torch.Tensor, topk_ids: torch.Tensor, tok_start: int,
                 overlap: MicrobatchOverlap) -> tuple[DispatchHandle, torch.Tensor]:
        overlap.maybe_run_recv_hook()
        num_tokens, k, h = hidden.shape[0], self.top_k, self.hidden_size
        bufs = self.reserve(overlap.current_ubatch_id(), num_tokens)
        ids = topk_ids.reshape(-1)
        routed = ids >= 0
        dest = ids.clamp(min=0) // self.experts_per_rank
        # A comparison, not F.one_hot: one_hot range-checks its input on the host.
        peers = torch.arange(self.peers, device=ids.device)
        onehot = ((dest.unsqueeze(1) == peers) & routed.unsqueeze(1)).long()
        pos = (onehot.cumsum(0) - 1).gather(1, dest.unsqueeze(1)).squeeze(1)
        flat = torch.where(routed, dest * (bufs.capacity + 1) + 1 + pos, bufs.rows)
        token_index = (torch.arange(num_tokens, device=ids.device) + tok_start
                       ).repeat_interleave(k)
        payload = torch.cat([hidden.repeat_interleave(k, 0),
                             torch.full((num_tokens * k, 1), float(self.rank), dtype=DTYPE,
                                        device=hidden.device),
                             token_index.to(DTYPE).unsqueeze(1),
                             ids.to(DTYPE).unsqueeze(1)], dim=1)
        send = bufs.dispatch_send
        send.zero_()
        send.index_copy_(0, flat, payload)
        blocks = send[:bufs.rows].view(bufs.peers, bufs.capacity + 1, self.width)
        blocks[:, 0, 0].copy_(onehot.sum(0).to(DTYPE))
        self._exchange(bufs.dispatch_recv, send[:bufs.rows], overlap)
        # Receiver: the delivered rows as expert inputs (read after the hook has run).
        recv = bufs.dispatch_recv.view(bufs.peers, bufs.capacity + 1, self.width)
        return DispatchHandle(flat, bufs), recv[:, 1:, :h]

    def _exchange(self, out: torch.Tensor, inp: torch.Tensor,
                  overlap: MicrobatchOverlap) -> None:
        """One all-to-all, overlapped the way the configured backend does it."""
        if self.blocking_all_to_all:
            # High throughput: let the sibling queue its compute, then a blocking exchange.
            overlap.yield_()
            self.all_to_all(out, inp)()
            return
        # Low latency: send now; the next microbatch runs the receive before it reads.
        overlap.register_recv_hook(self.all_to_all(out, inp))
        overlap.yield_()

    def _experts(self, expert_in: torch.Tensor, bufs: CommBuffers) -> torch.Tensor:
        """Local experts over the batched [P, C, H] receive; rows past a block's count or
        addressed to another rank's expert contribute nothing."""
        recv = bufs.dispatch_recv.view(bufs.peers, bufs.capacity + 1, self.width)
        counts = recv[:, 0, 0]
        slots = torch.arange(bufs.capacity, dtype=DTYPE, device=counts.device)
        present = slots.unsqueeze(0) < counts.unsqueeze(1)
        local = recv[:, 1:, self.hidden_size + EXPERT_COL] - self.rank * self.experts_per_rank
        x = expert_in.reshape(-1, self.hidden_size)
        out = torch.zeros_like(x)
        first = self.rank * self.experts_per_rank
        for e in range(self.experts_per_rank):
            mask = (present & (local == e)).reshape(-1, 1)
            out += mask * expert_mlp(x, self.weights.w1[first + e], self.weights.w2[first + e])
        return out.view(bufs.peers, bufs.capacity, self.hidden_size)

    def _finalize(self, expert_out: torch.Tensor, handle: DispatchHandle,
                  topk_weights: torch.Tensor, overlap: MicrobatchOverlap) -> torch.Tensor:
        overlap.maybe_run_recv_hook()
        bufs = handle.buffers
        send = bufs.combine_send
        send.copy_(bufs.dispatch_recv)  # counts and provenance travel back unchanged
        send.view(bufs.peers, bufs.capacity + 1, self.width)[:, 1:, :self.hidden_size].copy_(
            expert_out)
        self._exchange(bufs.combine_recv[:bufs.rows], send, overlap)
        # Receiver: gather each pair's returned row (the dump row is zero) and weight it.
        returned = bufs.combine_recv[handle.flat_index, :self.hidden_size]
        returned = returned.view(topk_weights.shape[0], self.top_k, self.hidden_size)
        return (returned * topk_weights.unsqueeze(2)).sum(1)


# -- drivers ----------------------------------------------------------------------------------

def run_step(model: MiniMoE, step: StepBuffers, cache: StateCache,
             slices: Sequence[UbatchSlice], metas: Sequence[UbatchMetadata]) -> None:
    """Run the step's microbatches one after another, each with its own metadata buffers and
    comm buffers (NoOverlap per microbatch): the sequential stand-in for the thread protocol."""
    if len(metas) < len(slices):
        raise ValueError(f"{len(slices)} microbatches but {len(metas)} metadata buffers")
    for i, sl in enumerate(slices):
        mb = prepare_microbatch(step, metas[i], sl, ubatch_id=i)
        model.forward(mb, cache, NoOverlap(i))
