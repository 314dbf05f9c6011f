"""A miniature MoE step: attention-lite over a per-request state cache, a top-k router and
experts sharded over the DP ranks, with dispatch/combine as fixed-size all-to-alls.

Every op of `MiniMoE.forward` is a tensor op on buffers of fixed shape (no `.item()`, no
branching on values), so a graph can capture it; a microbatch is a token slice plus a request
slice with its own query_start_loc/seq_lens buffers (docs/spec.md §4.4, §5.4). Tensors that
depend only on shapes (index ranges, filler columns, scalars) are built once
(harness/model/constants.py): neither a step nor its graph's replay spends an op on them.

How the known bugs (docs/spec.md §7) show:
- §7.1/§7.2 (replay with the captured request split): token -> request comes from the
  microbatch's query_start_loc, request -> slot from its slot_ids view, and each token reads
  its request's state plus the causal prefix; a split that disagrees with the metadata puts
  tokens into a neighbour's slot (double count), drops them (missed) or mis-scales positions.
- §7.3/§7.4 (a receive hook dropped or a sibling gone): the receive is never waited, so the
  peers' bounded wait raises CollectiveTimeout, or the output rows keep stale contents.
- §7.5/§7.6 (unreachable or re-captured twins) cost buffers, not rows: `reserved_buffers()`.
- §7.7 (asymmetric all-to-all): one rank's dispatch without its peers times out, bounded.
- Buffers sized from a microbatch's own unpadded tokens (a2a_buffers=unpadded): ranks with
  different real tokens exchange different sizes, and gloo aborts the receiving process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from harness.bug_switches import A2ABuffers, ReplayTag
from harness.config import All2AllBackend, HarnessConfig
from harness.model.comm_buffers import (
    EXPERT_COL,
    NUM_PROVENANCE_COLS,
    SRC_COL,
    TAG_COL,
    TOK_COL,
    CommBuffers,
    DispatchHandle,
    DispatchOverflow,
)
from harness.model.constants import ShapeConstants
from harness.model.state import StateCache
from harness.model.step_buffers import Microbatch
from harness.model.weights import DTYPE, MoEWeights, expert_mlp
from harness.runtime.overlap import MicrobatchOverlap, NoOverlap

Wait = Callable[[], None]
# Issue `out <- all_to_all(inp)` with equal splits and return how to wait for it.
AllToAll = Callable[[torch.Tensor, torch.Tensor], Wait]


def a2a_tokens_per_rank(config: HarnessConfig) -> int:
    """Tokens per rank the all-to-all buffers take: the largest batch (a2a_buffers
    max-tokens), or (vLLM issue #52176) one microbatch of it, rounded up."""
    if config.mutation.a2a_buffers is A2ABuffers.MICROBATCH and config.num_ubatches > 1:
        return -(-config.serving.max_num_batched_tokens // config.num_ubatches)
    return config.serving.max_num_batched_tokens


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
        self.hidden_size = config.model.hidden_size
        self.top_k = config.model.top_k
        self.peers = config.serving.dp_size
        self.experts_per_rank = config.model.experts_per_rank
        self.width = self.hidden_size + NUM_PROVENANCE_COLS
        # DeepEP low-latency style: a fixed max tokens per rank, so every rank sends the same
        # sizes whatever its own batch (an idle or unpadded rank included).
        self.capacity = a2a_tokens_per_rank(config) * config.model.top_k
        self.unpadded_buffers = config.mutation.a2a_buffers is A2ABuffers.UNPADDED
        self.blocking_all_to_all = config.serving.all2all_backend is All2AllBackend.HIGH_THROUGHPUT
        self._buffers: dict[tuple[int, int, int], CommBuffers] = {}
        self._last: dict[tuple[int, int], CommBuffers] = {}  # last used, per microbatch size
        self._lock = threading.Lock()
        # The run's readiness tag, as a receiver would poll for it: refreshed in place before
        # each run, so a graph reads the current one (docs/spec.md §7.23).
        self.run_tag = torch.zeros((), dtype=DTYPE, device=self.device)
        self.tag_value = 0  # the same, known on the host
        self.tag_baked_in = config.mutation.replay_tag is ReplayTag.CAPTURED
        self.constants = ShapeConstants(self.device)

    def set_run_tag(self, tag: int) -> None:
        self.tag_value = tag
        self.run_tag.fill_(float(tag))

    # -- buffers ---------------------------------------------------------------------------

    def reserve(self, ubatch_id: int, num_tokens: int,
                real_tokens: int | None = None) -> CommBuffers:
        """The comm buffers of microbatch `ubatch_id` at `num_tokens` (allocated on first use;
        call before a capture so the capture allocates nothing)."""
        capacity = self.capacity
        if self.unpadded_buffers:
            # The planted bug: this rank's own real tokens, not a size every rank shares.
            capacity = (num_tokens if real_tokens is None else real_tokens) * self.top_k
        key = (ubatch_id, num_tokens, capacity)
        with self._lock:
            if key not in self._buffers:
                self._buffers[key] = CommBuffers.allocate(self.peers, capacity, self.width,
                                                          self.device)
            self._last[(ubatch_id, num_tokens)] = self._buffers[key]
            return self._buffers[key]

    def reserved_buffers(self) -> dict[tuple[int, int, int], CommBuffers]:
        with self._lock:
            return dict(self._buffers)

    def received_routes(self, ubatch_id: int, num_tokens: int) -> list[tuple[int, int, int]]:
        """(source rank, token index, expert) of every row the last dispatch delivered here.
        Reads the buffers on the host: for checks after a step, never inside one."""
        with self._lock:
            bufs = self._last.get((ubatch_id, num_tokens))
        bufs = bufs or self.reserve(ubatch_id, num_tokens)
        recv = bufs.dispatch_recv.view(bufs.peers, bufs.capacity + 1, self.width).cpu()
        # One host conversion of the rows the counts reach (every row when a count is out of
        # range: its slice below then reads them by Python's rules, as a tensor's would).
        counts = [int(count) for count in recv[:, 0, 0].tolist()]
        reach = (1 + max(counts) if all(0 <= c <= bufs.capacity for c in counts)
                 else recv.shape[1])
        blocks = recv[:, :reach, self.hidden_size:].to(torch.int64).tolist()
        return [(row[SRC_COL], row[TOK_COL], row[EXPERT_COL])
                for block, count in zip(blocks, counts, strict=True)
                for row in block[1:1 + count]]

    def received_tags(self, ubatch_id: int, num_tokens: int) -> list[tuple[int, int, int]]:
        """(microbatch, source rank, readiness tag) of every block the last dispatch of that
        microbatch delivered here. Reads the buffers on the host, after a step."""
        with self._lock:
            bufs = self._last.get((ubatch_id, num_tokens))
        bufs = bufs or self.reserve(ubatch_id, num_tokens)
        recv = bufs.dispatch_recv.view(bufs.peers, bufs.capacity + 1, self.width)
        tags = recv[:, 0, TAG_COL].cpu().to(torch.int64).tolist()
        return [(ubatch_id, peer, tag) for peer, tag in enumerate(tags)]

    # -- forward ---------------------------------------------------------------------------

    def forward(self, mb: Microbatch, cache: StateCache,
                overlap: MicrobatchOverlap | None = None) -> None:
        """Run the microbatch and write its rows into `mb.output`; updates `cache` in place."""
        overlap = overlap if overlap is not None else NoOverlap(mb.ubatch_id)
        with torch.no_grad():
            hidden, real = self.attention(mb, cache)
            topk_weights, topk_ids = self.route(hidden, real)
            handle, expert_in = self._prepare(hidden, topk_ids, mb.tok_start, overlap,
                                              mb.real_tokens)
            expert_out = self._experts(expert_in, handle.buffers)
            moe_out = self._finalize(expert_out, handle, topk_weights, overlap)
            torch.add(hidden, moe_out, out=mb.output)

    def attention(self, mb: Microbatch, cache: StateCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal attention-lite: each real token reads its request's cached state plus the
        embeddings of the request's earlier tokens in this slice, scaled by the position the
        metadata implies; then the request's state absorbs its tokens' embeddings."""
        w = self.weights
        num_tokens, num_reqs = mb.input_ids.shape[0], mb.slot_ids.shape[0]
        qsl = mb.query_start_loc
        tok = self.constants.arange(num_tokens)
        req = torch.searchsorted(qsl[1:], tok, right=True)
        req_c = req.clamp(max=num_reqs - 1)
        start = qsl[req_c]
        real = ((req < num_reqs) & (tok >= start)).masked_fill_(mb.is_padding, False)
        slot = torch.where(real, mb.slot_ids[req_c], self.constants.scalar(cache.scratch_slot))
        emb = w.embedding[mb.input_ids]
        contrib = emb * real.unsqueeze(1)
        before = contrib.cumsum(0) - contrib
        prefix = before - before[start.clamp(max=num_tokens - 1)]
        context = cache.state[slot] + prefix
        implied_pos = mb.seq_lens[req_c] - (qsl[1:][req_c] - tok)
        scale = (implied_pos.clamp(min=0).to(DTYPE) + 1.0).reciprocal()
        # The history length the cached counts imply (docs/spec.md §4.4 step 4).
        history = (mb.computed[req_c] + (tok - start)).to(DTYPE).unsqueeze(1)
        hidden = (emb + torch.sin(mb.positions.to(DTYPE).unsqueeze(1) * w.pos_freq)
                  + torch.cos(history * w.pos_freq)
                  + torch.tanh((context @ w.state_proj) * scale.unsqueeze(1)))
        cache.state.index_add_(0, slot, contrib)
        return hidden, real

    def route(self, hidden: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k over all experts; non-real tokens get expert -1 and weight 0 (never sent)."""
        logits = hidden @ self.weights.router
        values, ids = logits.topk(self.top_k, dim=-1)
        weights = torch.softmax(values, dim=-1) * real.unsqueeze(1)
        return weights, torch.where(real.unsqueeze(1), ids, self.constants.scalar(-1))

    def _prepare(self, hidden: torch.Tensor, topk_ids: torch.Tensor, tok_start: int,
                 overlap: MicrobatchOverlap, real_tokens: int | None = None
                 ) -> tuple[DispatchHandle, torch.Tensor]:
        overlap.maybe_run_recv_hook()
        num_tokens, k, h = hidden.shape[0], self.top_k, self.hidden_size
        if num_tokens * k > self.capacity:
            # A shape check on the host, as DeepEP's dispatch asserts; no transfer starts.
            raise DispatchOverflow(f"rank {self.rank} dispatches {num_tokens} tokens into "
                                   f"all-to-all buffers of {self.capacity // k} tokens per rank")
        bufs = self.reserve(overlap.current_ubatch_id(), num_tokens, real_tokens)
        ids = topk_ids.reshape(-1)
        routed = ids >= 0
        # An unrouted pair (expert -1) floors to peer -1: no peer's column, and gather reads
        # peer 0 for it (its row goes to the dump row below).
        peer_of = ids // self.experts_per_rank
        dest = peer_of.clamp(min=0)
        # A comparison, not F.one_hot (which range-checks on the host); boolean, so cumsum
        # and sum count in int64 without a cast.
        onehot = peer_of.unsqueeze(1) == self.constants.arange(self.peers)
        # Each pair's row in its peer's block: 1 (past the count row) + its rank among the
        # pairs to that peer, which the inclusive cumsum gives directly.
        pos1 = onehot.cumsum(0).gather(1, dest.unsqueeze(1)).squeeze(1)
        flat = torch.where(routed, pos1.add(dest, alpha=bufs.capacity + 1),
                           self.constants.scalar(bufs.rows))
        payload = torch.cat([hidden.repeat_interleave(k, 0),
                             self.constants.column(num_tokens * k, float(self.rank)),
                             self.constants.token_index(tok_start, num_tokens, k),
                             ids.to(DTYPE).unsqueeze(1)], dim=1)
        send = bufs.dispatch_send
        send.zero_()
        send.index_copy_(0, flat, payload)
        blocks = send[:bufs.rows].view(bufs.peers, bufs.capacity + 1, self.width)
        blocks[:, 0, 0].copy_(onehot.sum(0))  # copy_ converts the counts to DTYPE
        if self.tag_baked_in:
            blocks[:, 0, TAG_COL].fill_(float(self.tag_value))  # a constant in a graph
        else:
            blocks[:, 0, TAG_COL].copy_(self.run_tag.expand(bufs.peers))
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
        slots = self.constants.arange(bufs.capacity, DTYPE)
        present = slots.unsqueeze(0) < counts.unsqueeze(1)
        # Rows past a block's count take expert -1, which no expert matches.
        expert = torch.where(present, recv[:, 1:, self.hidden_size + EXPERT_COL],
                             self.constants.scalar(-1, DTYPE))
        x = expert_in.reshape(-1, self.hidden_size)
        first = self.rank * self.experts_per_rank
        out = None
        for e in range(first, first + self.experts_per_rank):
            mask = (expert == e).reshape(-1, 1)
            term = mask * expert_mlp(x, self.weights.w1[e], self.weights.w2[e])
            out = term if out is None else out.add_(term)
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
