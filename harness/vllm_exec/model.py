"""The miniature MoE as vLLM's execution code runs a model: a callable over the forward
context, whose expert all-to-all follows vLLM's modular-kernel pattern.

- Attention metadata comes from the forward context vLLM's runner installs per microbatch
  (`attn_metadata[LAYER]`, built by `MiniModelState.prepare_attn` from vLLM's own sliced
  InputBatch), the microbatch id and token offset from vLLM's `dbo_current_ubatch_*`.
- Low latency (DeepEP LL): `dbo_maybe_run_recv_hook`, an async all-to-all, then
  `dbo_register_recv_hook(work.wait)` and `dbo_yield` (modular_kernel.py's prepare/finalize).
- High throughput (DeepEP HT): `dbo_yield_and_switch_from_compute_to_comm`, a blocking
  all-to-all on the comm stream, `dbo_switch_to_compute_sync` (deepep_ht.py).

Every microbatch's error is kept with the line it was raised at, and every receive is
traced (issued, hook ran, read), so the checkers see what vLLM's own report hides.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import torch

from harness.bug_switches import SwitchToCompute
from harness.config import HarnessConfig
from harness.faults import Fault, FaultKind, InjectedFault
from harness.history.records import RecvEvent, UbatchError
from harness.history.step_error import error_of
from harness.model.mini_moe import MiniMoE
from harness.model.state import StateCache
from harness.model.step_buffers import Microbatch
from harness.model.weights import DTYPE
from harness.runtime.sanitizer import sanitized_thread
from harness.vllm_exec.ids_gather import AllGather, IdsGather
from harness.vllm_exec.stream_log import OFF, StreamLog

LAYER = "mini.attn"  # the one attention layer's name in vLLM's per-layer metadata
READER = {"dispatch": "experts", "combine": "combine gather"}  # what reads each receive


@dataclass(frozen=True)
class AttnMeta:
    """One microbatch's attention metadata, in persistent buffers a graph reads at replay."""

    query_start_loc: torch.Tensor  # [R + 1], rebased onto the microbatch's tokens
    seq_lens: torch.Tensor  # [R]
    slot_ids: torch.Tensor  # [R]: request -> state-cache slot (vLLM's idx_mapping)


def where_raised(exc: BaseException) -> str:
    """file:line (function) of the frame that raised `exc`, or of its deepest cause."""
    while exc.__cause__ is not None and exc.__traceback__ is None:
        exc = exc.__cause__
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f"{last.filename}:{last.lineno} ({last.name})"


class StepTrace:
    """What one step's microbatches did: their errors, and the life of every receive."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.errors: list[UbatchError] = []
        self.recv: list[RecvEvent] = []
        self._next_id = 0

    def new_receive(self, ubatch: int, what: str) -> int:
        with self._lock:
            rid = self._next_id
            self._next_id += 1
            self.recv.append(RecvEvent("issued", rid, ubatch, what))
            return rid

    def note(self, kind: str, rid: int, ubatch: int, what: str) -> None:
        with self._lock:
            self.recv.append(RecvEvent(kind, rid, ubatch, what))

    def failed(self, ubatch: int, exc: BaseException) -> None:
        with self._lock:
            self.errors.append(UbatchError(ubatch, error_of(exc), where_raised(exc)))


class _VllmOverlap:
    """The harness model's overlap calls, answered by vLLM's module-level dbo_* functions."""

    def __init__(self, ubatching: ModuleType) -> None:
        self.u = ubatching

    def maybe_run_recv_hook(self) -> None:
        self.u.dbo_maybe_run_recv_hook()

    def register_recv_hook(self, hook) -> None:
        self.u.dbo_register_recv_hook(hook)

    def yield_(self) -> None:
        self.u.dbo_yield()

    def current_ubatch_id(self) -> int:
        return self.u.dbo_current_ubatch_id()


class VllmStyleMoE(MiniMoE):
    """MiniMoE whose all-to-alls hand off through vLLM's ubatching functions, with faults."""

    def __init__(self, config: HarnessConfig, rank: int, all_to_all, ubatching: ModuleType,
                 device: str = "cpu", stream_log: StreamLog = OFF, *,
                 all_gather: AllGather) -> None:
        super().__init__(config, rank, all_to_all, device=device)
        self.u = ubatching
        self.stream_log = stream_log
        # A microbatch never holds more than a step's tokens: one buffer size for every rank.
        self.ids = IdsGather(all_gather, ubatching, stream_log, rank, self.peers,
                             config.serving.max_num_batched_tokens * self.top_k,
                             config.mutation.ids_gather_wait, self.device)
        self.switch_sync = config.mutation.switch_to_compute is SwitchToCompute.SYNC
        self.overlap = _VllmOverlap(ubatching)
        self.trace = StepTrace()
        self.faults: dict[int, set[FaultKind]] = {}
        self.slow_s: dict[int, float] = {}
        self._exchanges: dict[int, int] = {}
        self.running = threading.local()  # .ubatch: the microbatch this thread runs

    def arm(self, faults: Sequence[Fault]) -> StepTrace:
        """The faults of the coming step, per microbatch; a fresh trace for it."""
        self.faults = {}
        self.slow_s = {}
        for f in faults:
            self.faults.setdefault(f.ubatch, set()).add(f.kind)
            if f.kind is FaultKind.SLOW_UBATCH:
                self.slow_s[f.ubatch] = f.seconds
        self._exchanges = {}
        self.trace = StepTrace()
        return self.trace

    def starting(self, ub: int) -> None:
        """Microbatch `ub` starts a forward, one layer: its next exchange is the dispatch
        (a warm-up or a capture runs between steps, with no `arm`)."""
        self.running.ubatch = ub
        self._exchanges[ub] = 0

    def _has(self, ubatch: int, kind: FaultKind) -> bool:
        return kind in self.faults.get(ubatch, ())

    def route(self, hidden: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The router's top-k, then the ids exchange the dispatch routes by (§11.5)."""
        self.ids.before_routing()
        weights, topk_ids = super().route(hidden, real)
        return weights, self.ids.exchange(self.u.dbo_current_ubatch_id(), topk_ids)

    def _exchange(self, out: torch.Tensor, inp: torch.Tensor, overlap) -> None:
        ub = self.u.dbo_current_ubatch_id()
        nth = self._exchanges.get(ub, 0)
        self._exchanges[ub] = nth + 1
        what = "dispatch" if nth == 0 else "combine"
        stage = FaultKind.RAISE_IN_DISPATCH if nth == 0 else FaultKind.RAISE_IN_COMBINE
        if self._has(ub, stage):
            raise InjectedFault(f"injected failure in microbatch {ub}'s {what}")
        # The caller packed the send buffer on the current stream just now.
        self.stream_log.access("write", f"{what} send of microbatch {ub}", f"{what} pack")
        if self.blocking_all_to_all:
            self._blocking(out, inp, ub, what)
        else:
            self._with_recv_hook(out, inp, ub, what)
        # The caller reads the receive next, on the stream current now.
        self.stream_log.access("read", f"{what} recv of microbatch {ub}", READER[what])
        if nth == 0 and self._has(ub, FaultKind.RAISE_IN_UBATCH):
            raise InjectedFault(f"injected failure in microbatch {ub} after its first yield")

    def _with_recv_hook(self, out, inp, ub: int, what: str) -> None:
        rid = self.trace.new_receive(ub, what)
        self.stream_log.access("read", f"{what} send of microbatch {ub}", "all_to_all")
        wait = self.all_to_all(out, inp)
        faulty = self._has(ub, FaultKind.RAISE_IN_RECV_HOOK)

        def hook() -> None:
            wait()
            self.stream_log.access("write", f"{what} recv of microbatch {ub}", "all_to_all")
            # Not vLLM's dbo_current_ubatch_id: a context runs hooks on its way out too,
            # after it has left vLLM's thread map.
            self.trace.note("hook", rid, self.running.ubatch, what)
            if faulty:
                raise InjectedFault(f"injected failure in the receive hook of microbatch "
                                    f"{ub}'s {what}")

        if self.u.dbo_enabled():
            self.u.dbo_register_recv_hook(hook)
            self._yield(ub)
        else:
            hook()
        self.trace.note("read", rid, ub, what)

    def _blocking(self, out, inp, ub: int, what: str) -> None:
        enabled = self.u.dbo_enabled()
        if enabled:
            self.u.dbo_yield_and_switch_from_compute_to_comm()
            self._slow(ub)
        rid = self.trace.new_receive(ub, what)
        self._log_all_to_all(ub, what)
        self.all_to_all(out, inp)()
        self.trace.note("hook", rid, ub, what)
        if enabled and self.switch_sync:
            self.u.dbo_switch_to_compute_sync()
        elif enabled:
            self.u.dbo_switch_to_compute()  # the planted slip: no event for compute to wait on
        self.trace.note("read", rid, ub, what)

    def _log_all_to_all(self, ub: int, what: str) -> None:
        self.stream_log.access("read", f"{what} send of microbatch {ub}", "all_to_all")
        self.stream_log.access("write", f"{what} recv of microbatch {ub}", "all_to_all")

    def _yield(self, ub: int) -> None:
        self.u.dbo_yield()
        self._slow(ub)

    def _slow(self, ub: int) -> None:
        seconds = self.slow_s.pop(ub, 0.0)
        if seconds:
            time.sleep(seconds)


class MiniModel:
    """What vLLM's runner calls as `model(**model_inputs)`: one microbatch (or the whole
    step) of the miniature, reading its metadata from vLLM's forward context."""

    def __init__(self, moe: VllmStyleMoE, cache: StateCache, forward_context: ModuleType) -> None:
        self.moe = moe
        self.cache = cache
        self.forward_context = forward_context

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 **unused: object) -> torch.Tensor:
        ub = self.moe.u.dbo_current_ubatch_id()
        self.moe.starting(ub)
        try:
            with sanitized_thread():  # vLLM's microbatch threads, under CUDA's sanitizer
                return self._forward(input_ids, positions, ub)
        except BaseException as exc:
            self.moe.trace.failed(ub, exc)
            raise

    def _forward(self, input_ids, positions, ub: int) -> torch.Tensor:
        ctx = self.forward_context.get_forward_context()
        meta: AttnMeta = ctx.attn_metadata[LAYER]
        num_tokens, num_reqs = input_ids.shape[0], meta.slot_ids.shape[0]
        out = torch.zeros(num_tokens, self.moe.hidden_size, dtype=DTYPE, device=self.moe.device)
        qsl, seq_lens = meta.query_start_loc[:num_reqs + 1], meta.seq_lens[:num_reqs]
        # vLLM's sliced metadata carries seq_lens: the cached counts are what they imply.
        computed = seq_lens.long() - (qsl[1:] - qsl[:-1])
        mb = Microbatch(ub, self.moe.u.dbo_current_ubatch_token_offset(), input_ids.long(),
                        positions, ctx.is_padding, qsl, seq_lens, meta.slot_ids, out, computed)
        if self.moe._has(ub, FaultKind.RETURN_WITHOUT_YIELDING):
            return out.zero_()  # skips its MoE layer: no all-to-all, no yield
        self.moe.forward(mb, self.cache, self.moe.overlap)
        return out
