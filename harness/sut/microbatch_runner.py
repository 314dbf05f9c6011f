"""The microbatch runner (vLLM's UBatchRunner; docs/spec.md §4.3-4.4, §5.1): prepare, then a
two-phase run.

`begin_capturable_run` starts the microbatch threads, sets them up and parks them at the ready
barrier, all outside any graph; the `finish` it returns only wakes microbatch 0 and joins, so
that is all a graph captures besides the threads' own launches on the capture stream.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from harness.bug_switches import LookbackRefresh
from harness.config import HarnessConfig
from harness.faults import Fault, FaultKind, InjectedFault
from harness.model.mini_moe import MiniMoE
from harness.model.state import StateCache
from harness.model.step_buffers import Microbatch, StepBuffers, UbatchMetadata, prepare_microbatch
from harness.model.ubatch_slice import UbatchSlice
from harness.runtime.sanitizer import sanitized_thread
from harness.runtime.ubatching import MicrobatchThreads, UBatchContext
from harness.sut.slicing import clamped_ubatch_slices


def prepare_options(config: HarnessConfig, for_replay: bool) -> dict:
    """The planted slips `prepare_microbatch` takes (docs/spec.md §7.18-7.19)."""
    m = config.mutation
    return {"continuation": m.continuation,
            "rebind_lookback": for_replay and m.lookback_refresh is LookbackRefresh.REBIND}


@dataclass(frozen=True)
class UbatchState:
    slices: tuple[UbatchSlice, ...]
    microbatches: tuple[Microbatch, ...]


class _FaultyOverlap:
    """The microbatch's own context, raising once it has yielded `after_yields` times."""

    def __init__(self, ctx: UBatchContext, after_yields: int) -> None:
        self.ctx = ctx
        self.after_yields = after_yields

    def maybe_run_recv_hook(self) -> None:
        self.ctx.maybe_run_recv_hook()

    def register_recv_hook(self, hook) -> None:
        self.ctx.register_recv_hook(hook)

    def current_ubatch_id(self) -> int:
        return self.ctx.current_ubatch_id()

    def yield_(self) -> None:
        self.ctx.yield_()
        if self.ctx.num_yields >= self.after_yields:
            raise InjectedFault(f"injected failure in microbatch {self.ctx.id}")


class MicrobatchRunner:
    def __init__(self, config: HarnessConfig, streams, hang_timeout_s: float, *,
                 warm_cublas: bool = True) -> None:
        self.config = config
        self.num_ubatches = config.num_ubatches
        self.streams = streams
        # Off only to show the hazard: a thread whose first matmul on the capture stream
        # happens inside the capture invalidates it.
        self.warm_cublas = warm_cublas
        # One metadata pair per microbatch: all microbatches are live at once, and a graph
        # reads them at fixed addresses.
        self.metas = [UbatchMetadata(config.serving.max_num_reqs, streams.device)
                      for _ in range(self.num_ubatches)]
        self.capture_stream = streams.new_stream("ubatch-capture")
        self.threads = MicrobatchThreads(config.mutation.protocol.value,
                                         hang_timeout_s=hang_timeout_s,
                                         barrier_timeout_s=hang_timeout_s)
        self._pending_finish: Callable[[], None] | None = None

    @property
    def has_pending_run(self) -> bool:
        return self._pending_finish is not None

    def alive_threads(self) -> list[str]:
        return [t.name for t in self.threads.alive_threads()]

    def prepare(self, step: StepBuffers, query_lens: Sequence[int],
                for_replay: bool = False, split_uct: int | None = None) -> UbatchState:
        """Split the (padded) step (cut by `split_uct`, slicing.split_uct_of) and write each
        microbatch's metadata in place."""
        slices = clamped_ubatch_slices(query_lens, step.num_tokens, step.num_reqs,
                                       self.num_ubatches, split_uct)
        options = prepare_options(self.config, for_replay)
        microbatches = tuple(prepare_microbatch(step, self.metas[i], s, i, **options)
                             for i, s in enumerate(slices))
        return UbatchState(slices, microbatches)

    def begin_capturable_run(self, model: MiniMoE, cache: StateCache, state: UbatchState,
                             for_capture: bool = False,
                             faults: Sequence[Fault] = ()) -> Callable[[], None]:
        """Start, set up and park the threads; return `finish` (call once, or abort)."""
        # At capture the threads must launch where the graph records.
        compute_stream = (self.capture_stream if for_capture
                          else self.streams.current_stream())
        bodies = [self._body(model, cache, mb, faults)
                  for mb in state.microbatches]
        finish_threads = self.threads.begin_run(
            bodies, self.streams, compute_stream,
            setup=self._thread_setup(for_capture, compute_stream))

        def finish() -> None:
            try:
                finish_threads()
            finally:
                self._pending_finish = None

        self._pending_finish = finish
        return finish

    def run(self, model: MiniMoE, cache: StateCache, state: UbatchState,
            faults: Sequence[Fault] = ()) -> None:
        self.begin_capturable_run(model, cache, state, faults=faults)()

    def abort_pending_run(self) -> None:
        """Release threads parked by a run that will never finish (e.g. a failed capture)."""
        if self._pending_finish is None:
            return
        self._pending_finish = None
        self.threads.abort_pending()

    @staticmethod
    def _body(model: MiniMoE, cache: StateCache, mb: Microbatch,
              faults: Sequence[Fault]) -> Callable[[UBatchContext], None]:
        kinds = {f.kind for f in faults if f.ubatch == mb.ubatch_id}

        def body(ctx: UBatchContext) -> None:
            if FaultKind.RETURN_WITHOUT_YIELDING in kinds:
                return
            overlap = (_FaultyOverlap(ctx, after_yields=1)
                       if FaultKind.RAISE_IN_UBATCH in kinds else ctx)
            with sanitized_thread():  # the protocol's threads, under CUDA's sanitizer
                model.forward(mb, cache, overlap)

        return body

    def _thread_setup(self, for_capture: bool, compute_stream) -> Callable[[], None] | None:
        device = self.streams.device
        if device.type != "cuda":
            return None
        warm = for_capture and self.warm_cublas

        def setup() -> None:
            # New threads do not inherit the device; cuBLAS must allocate before a capture.
            torch.cuda.set_device(device)
            if warm:
                with self.streams.use(compute_stream):
                    torch.cuda.current_blas_handle()

        return setup
