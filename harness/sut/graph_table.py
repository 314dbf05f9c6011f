"""Capture candidates, microbatch twins, capture order and dispatch (docs/spec.md §2.2).

A `GraphTable` is what vLLM's CudaGraphManager decides before capturing anything: which
descriptors get a graph, in which order they are captured, and which one serves a batch.
It is a pure function of the config (and, for the asymmetry fault, of the rank).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from functools import cached_property

from harness.config import CudaGraphMode, HarnessConfig, Twins
from harness.config_values import varlen_decode_token_sizes
from harness.history.decision import GraphDescriptor
from harness.sut.descriptor import is_compatible
from harness.sut.slicing import split_uct_of
from harness.sut.thresholds import guard_sends_to_eager, ubatch_thresholds_met


def ubatch_twin(config: HarnessConfig, desc: GraphDescriptor,
                decode_threshold: int | None = None) -> GraphDescriptor | None:
    """The microbatched twin of a FULL descriptor, when one is eligible (docs/spec.md §2.2
    rule 1)."""
    if not config.use_ubatching or desc.cg_mode is not CudaGraphMode.FULL:
        return None
    if desc.num_reqs is None:
        return None
    # Uniform query lengths are what keep the captured request split valid at replay.
    uct, remainder = divmod(desc.num_tokens, desc.num_reqs)
    if remainder or desc.uniform_token_count not in (None, uct):
        return None
    k = config.num_ubatches
    if desc.num_tokens < k:
        return None
    # The DP sync's own threshold, so every rank derives the same twins from the config.
    if not ubatch_thresholds_met(config, desc.num_tokens, uniform_decode=True,
                                 decode_threshold=decode_threshold):
        return None
    return replace(desc, num_ubatches=k, uniform_token_count=uct)


def _capture_candidates(config: HarnessConfig, rank: int) -> list[GraphDescriptor]:
    if config.serving.release.request_keyed_decode:
        return _candidates_by_requests(config, rank)
    return _candidates_by_tokens(config, rank)


def _candidates_by_tokens(config: HarnessConfig, rank: int) -> list[GraphDescriptor]:
    """0.33's descriptors in vLLM's generation order: per size, decode branch then mixed."""
    mode = config.serving.cudagraph_mode
    if mode is CudaGraphMode.NONE:
        return []
    decode_mode, mixed_mode = mode.decode_mode(), mode.mixed_mode()
    q = config.serving.decode_query_len
    max_decode_tokens = config.serving.max_num_reqs * q
    threshold = config.decode_threshold_for_rank(rank)
    out: list[GraphDescriptor] = []

    def add(desc: GraphDescriptor | None, dedupe: bool) -> None:
        if desc is not None and not (dedupe and desc in out):
            out.append(desc)

    for size in config.cudagraph_capture_sizes:
        if (mode.separate_routine() and decode_mode is not CudaGraphMode.NONE
                and config.serving.varlen_decode):
            # Varlen decode graphs (vLLM's varlen_decode, docs/spec.md §2.2 rule 2): any mix
            # of 1..q tokens per request, so as many requests as tokens (up to the limit).
            if size <= max_decode_tokens:
                add(GraphDescriptor(decode_mode, size, min(size, config.serving.max_num_reqs),
                                    max_query_len=q), dedupe=False)
        elif mode.separate_routine() and decode_mode is not CudaGraphMode.NONE:
            tokens = -(-size // q) * q
            reqs = tokens // q
            if (tokens <= max_decode_tokens and tokens <= config.max_capture_size
                    and reqs <= config.serving.max_num_reqs):
                desc = GraphDescriptor(decode_mode, tokens, reqs, uniform_token_count=q)
                add(desc, dedupe=True)
                add(ubatch_twin(config, desc, threshold), dedupe=True)
        if mixed_mode is not CudaGraphMode.NONE:
            mixed = _mixed(config, mixed_mode, size)
            add(mixed, dedupe=False)
            add(ubatch_twin(config, mixed, threshold), dedupe=False)
    return out


def _mixed(config: HarnessConfig, mixed_mode: CudaGraphMode, size: int) -> GraphDescriptor:
    # PIECEWISE graphs pad no requests; FULL ones pad to as many requests as tokens.
    reqs = min(size, config.serving.max_num_reqs) if mixed_mode is CudaGraphMode.FULL else None
    return GraphDescriptor(mixed_mode, size, reqs)


def decode_request_sizes(config: HarnessConfig) -> list[int]:
    """0.34: the request counts the capture sizes round up to at the decode query length,
    within the largest capture size (docs/spec.md §2.6)."""
    q, top = config.serving.decode_query_len, config.max_capture_size
    return sorted({min(-(-s // q), config.serving.max_num_reqs)
                   for s in config.cudagraph_capture_sizes if -(-s // q) * q <= top})


def decode_graph_requests(config: HarnessConfig, q: int, most_reqs: int) -> list[int]:
    """0.34: n of each n-request x q-token decode graph; the first count above the limit is
    captured at the limit (min(most requests of q, largest size // q)), the rest not at all."""
    limit = min(most_reqs, config.max_capture_size // q)
    if limit < 1:
        return []
    counts = decode_request_sizes(config)
    return sorted({min(n, limit) for n in counts[:bisect.bisect_left(counts, limit) + 1]})


def _candidates_by_requests(config: HarnessConfig, rank: int) -> list[GraphDescriptor]:
    """0.34's descriptors: decode graphs by request count (each with its twin), or varlen
    decode graphs by token count, then the token-keyed mixed graphs with their twins."""
    mode = config.serving.cudagraph_mode
    if mode is CudaGraphMode.NONE:
        return []
    decode_mode, mixed_mode = mode.decode_mode(), mode.mixed_mode()
    q, max_reqs = config.serving.decode_query_len, config.serving.max_num_reqs
    threshold = config.decode_threshold_for_rank(rank)
    out: list[GraphDescriptor | None] = []
    if mode.separate_routine() and decode_mode is not CudaGraphMode.NONE:
        if config.serving.varlen_decode:
            top = max(decode_request_sizes(config), default=0) * q
            out += [GraphDescriptor(decode_mode, t, min(t, max_reqs), max_query_len=q)
                    for t in varlen_decode_token_sizes(
                        min(top, config.serving.max_num_batched_tokens))]
        else:
            for length, most in sorted(config.decode_query_lens):
                for n in decode_graph_requests(config, length, most):
                    desc = GraphDescriptor(decode_mode, n * length, n,
                                           uniform_token_count=length)
                    out += [desc, ubatch_twin(config, desc, threshold)]
    if mixed_mode is not CudaGraphMode.NONE:
        for size in config.cudagraph_capture_sizes:
            desc = _mixed(config, mixed_mode, size)
            out += [desc, ubatch_twin(config, desc, threshold)]
    return [d for d in out if d is not None]


def _specificity(desc: GraphDescriptor) -> tuple:
    # Within one size, more specific descriptors are tried first (docs/spec.md §2.2 rule 5).
    return (desc.uniform_token_count is None, desc.max_query_len is None,
            desc.num_reqs is None, desc.num_reqs or 0)


@dataclass(frozen=True)
class GraphTable:
    config: HarnessConfig
    rank: int
    # Generation order; capture_order() and the dispatch order are derived from it.
    descriptors: tuple[GraphDescriptor, ...]

    @classmethod
    def build(cls, config: HarnessConfig, rank: int = 0) -> GraphTable:
        table = cls(config, rank, tuple(_capture_candidates(config, rank)))
        if config.mutation.twins is Twins.REACHABLE:
            unreachable = set(table.unreachable_twins())
            table = cls(config, rank, tuple(d for d in table.descriptors if d not in unreachable))
        return table

    @property
    def twins(self) -> tuple[GraphDescriptor, ...]:
        return tuple(d for d in self.descriptors if d.microbatched)

    def capture_order(self) -> tuple[GraphDescriptor, ...]:
        """PIECEWISE then FULL; within a mode by size descending, twins after their base."""
        ordered: list[GraphDescriptor] = []
        for mode in (CudaGraphMode.PIECEWISE, CudaGraphMode.FULL):
            of_mode = [d for d in self.descriptors if d.cg_mode is mode]
            ordered.extend(sorted(of_mode, key=lambda d: -d.num_tokens))
        return tuple(ordered)

    def is_request_keyed(self, desc: GraphDescriptor) -> bool:
        """0.34: a uniform decode graph of a separate decode routine, looked up by the batch's
        query length and request count before any token-keyed graph (docs/spec.md §2.6)."""
        mode = self.config.serving.cudagraph_mode
        return (self.config.serving.release.request_keyed_decode and mode.separate_routine()
                and desc.cg_mode is mode.decode_mode() and desc.uniform_token_count is not None)

    @cached_property
    def _dispatch_order(self) -> tuple[GraphDescriptor, ...]:
        ordered = sorted((d for d in self.descriptors if self.is_request_keyed(d)),
                         key=lambda d: d.num_tokens)
        for mode in (CudaGraphMode.FULL, CudaGraphMode.PIECEWISE):
            of_mode = [d for d in self.descriptors
                       if d.cg_mode is mode and not self.is_request_keyed(d)]
            ordered.extend(sorted(of_mode, key=lambda d: (d.num_tokens, _specificity(d))))
        return tuple(ordered)

    def dispatch(self, num_reqs: int, num_tokens: int, uniform_token_count: int | None,
                 max_query_len: int | None = None, num_ubatches: int = 1) -> GraphDescriptor:
        """The first compatible graph: under 0.34 the smallest request-keyed decode graph of
        the batch's query length; then the smallest FULL size, then PIECEWISE; else eager."""
        if num_tokens > 0:
            for desc in self._dispatch_order:
                if desc.num_tokens >= num_tokens and is_compatible(
                        desc, num_reqs=num_reqs, num_tokens=num_tokens,
                        uniform_token_count=uniform_token_count, max_query_len=max_query_len,
                        num_ubatches=num_ubatches):
                    return desc
        return GraphDescriptor(CudaGraphMode.NONE, num_tokens, num_reqs,
                               num_ubatches=num_ubatches)

    def reaching_batch_size(self, twin: GraphDescriptor) -> int | None:
        """A legal uniform-decode step size that the DP sync would run on `twin`, if any.

        All ranks at one count n is the easiest case for the guard (it looks at the minimum,
        dispatch at the maximum), and the largest n <= the twin's size is the easiest n.
        """
        q, k = twin.uniform_token_count, self.config.num_ubatches
        most = self.config.longest_uniform_batch(q) if q is not None else 0
        if most == 0:
            return None  # replay needs this exact query length: only drafts make uct > 1
        largest = min(twin.num_tokens, most * q, self.config.serving.max_num_batched_tokens)
        n = largest - largest % q
        # The DP sync calls a batch a uniform decode only at the widest query length (§1.6).
        if n < 1 or not ubatch_thresholds_met(self.config, n, uniform_decode=(
                q == self.config.serving.decode_query_len)):
            return None
        if self.dispatch(n // q, n, q, num_ubatches=k) != twin:
            return None
        if guard_sends_to_eager(self.config.mutation.guard, n, twin.num_tokens, k,
                                split_uct_of(self.config, twin, None)):
            return None
        return n

    def unreachable_twins(self) -> tuple[GraphDescriptor, ...]:
        """Twins captured for nothing: no legal batch ever dispatches to them (docs/spec.md
        §7.5)."""
        return tuple(t for t in self.twins if self.reaching_batch_size(t) is None)
