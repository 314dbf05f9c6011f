"""The graph manager (vLLM's CudaGraphManager, docs/spec.md §6.2-6.3): capture and replay.

Every FULL descriptor of the graph table is captured in vLLM's order, each after an eager
warmup on the same persistent buffers; a microbatched one parks fresh threads outside the
graph and captures only their wake-up and joins. PIECEWISE graphs (attention eager between
captured pieces) are not modelled: such steps run eagerly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace

from harness.batch import dummy_query_lens
from harness.bug_switches import CaptureKey
from harness.config import CaptureOn, CudaGraphMode, HarnessConfig
from harness.history.decision import DpSyncState, GraphDescriptor
from harness.model.mini_moe import MiniMoE
from harness.model.state import RequestSpec, StateCache
from harness.model.step_buffers import StepBuffers, UbatchMetadata, prepare_microbatch
from harness.model.ubatch_slice import UbatchSlice
from harness.runtime.comm import CollectiveLog
from harness.sut.graph_table import GraphTable
from harness.sut.microbatch_runner import MicrobatchRunner, prepare_options
from harness.sut.slicing import region_bounds, split_uct_of
from harness.sut.staged_replay import StagedLayout, restore, stage

Fingerprint = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class CapturedGraph:
    desc: GraphDescriptor
    graph: object
    buffers: StepBuffers
    split: tuple[UbatchSlice, ...]  # the request/token split frozen at capture
    fingerprint: Fingerprint  # the collectives the graph issues at every replay
    empty: bool | None  # the backend found nothing recorded


class GraphManager:
    def __init__(self, config: HarnessConfig, table: GraphTable, streams, backend,
                 runner: MicrobatchRunner, model: MiniMoE, cache: StateCache,
                 log: CollectiveLog) -> None:
        self.config = config
        self.table = table
        self.streams = streams
        self.backend = backend
        self.runner = runner
        self.model = model
        self.cache = cache
        self.log = log
        self.pool = backend.new_pool()
        # A non-default stream for graphs that are not microbatched (vLLM's graph_capture).
        self.graph_stream = streams.new_stream("graph")
        self.whole_step_meta = UbatchMetadata(config.serving.max_num_reqs, streams.device)
        # Keyed by `store_key`; dispatch looks a graph up by its own descriptor.
        self.captured: dict[GraphDescriptor, CapturedGraph] = {}

    def store_key(self, desc: GraphDescriptor) -> GraphDescriptor:
        """The key a captured graph is stored under: its descriptor, or (capture_key
        first-two, vLLM issue #43145) the tokens of its first two microbatches only."""
        if not desc.microbatched or self.config.mutation.capture_key is CaptureKey.TOTAL:
            return desc
        first_two = sum(end - start for start, end in region_bounds(
            desc.num_tokens, desc.num_ubatches, split_uct_of(self.config, desc, None))[:2])
        return replace(desc, num_tokens=first_two)

    def lookup(self, desc: GraphDescriptor) -> CapturedGraph | None:
        """The graph a step replays for `desc`, looked up by its total token count."""
        return self.captured.get(desc)

    def capture_stream_for(self, desc: GraphDescriptor):
        if not desc.microbatched:
            return self.graph_stream
        if self.config.mutation.capture_on is CaptureOn.SIDE:
            # The draft's bug: torch.cuda.graph's own side stream, not the threads' stream.
            return self.streams.new_stream(f"side-{desc.label()}")
        return self.runner.capture_stream

    def capture_all(self) -> None:
        """Warm up and capture every FULL descriptor, largest first; parked threads of a
        failed capture are always released."""
        with ExitStack() as stack:
            stack.callback(self.runner.abort_pending_run)
            for desc in self.table.capture_order():
                if desc.cg_mode is CudaGraphMode.FULL:
                    self._warmup_and_capture(desc)

    def _dummy_step(self, desc: GraphDescriptor) -> tuple[StepBuffers, tuple[int, ...]]:
        buffers = StepBuffers(desc.num_tokens, desc.num_reqs, self.config.model.hidden_size,
                              self.cache.scratch_slot, self.streams.device)
        lens = dummy_query_lens(desc.num_reqs, desc.num_tokens)
        scratch = self.cache.scratch_slot
        buffers.fill([RequestSpec(scratch, 0, (0,) * q) for q in lens])
        buffers.is_padding.fill_(True)  # capture runs on dummy rows only
        return buffers, lens

    def _warmup_and_capture(self, desc: GraphDescriptor) -> None:
        buffers, lens = self._dummy_step(desc)
        if desc.microbatched:
            # Warmup: allocates comm buffers outside capture (the threads that capture warm
            # their own cuBLAS up on the capture stream, in the runner).
            self.run_eager(desc, buffers, lens)
        else:
            # A whole step is captured by this thread on the graph stream: warm it up there,
            # as vLLM's graph_capture does, so nothing is set up lazily inside the capture.
            with self._on(self.graph_stream):
                self.run_eager(desc, buffers, lens)
        graph = self.backend.new_graph()
        start = self.log.mark()
        if desc.microbatched:
            state = self.runner.prepare(buffers, lens,
                                        split_uct=split_uct_of(self.config, desc, None))
            finish = self.runner.begin_capturable_run(self.model, self.cache, state,
                                                      for_capture=True)
            with self.backend.capture(graph, self.capture_stream_for(desc), pool=self.pool):
                finish()
            split = state.slices
        else:
            mb = self._prepare_whole(buffers)
            with self.backend.capture(graph, self.capture_stream_for(desc), pool=self.pool):
                self.model.forward(mb, self.cache)
            split = (buffers.whole(),)
        self.captured[self.store_key(desc)] = CapturedGraph(
            desc, graph, buffers, split, self.log.since(start), graph.is_empty)

    @contextmanager
    def _on(self, stream) -> Iterator[None]:
        """Run the block on `stream`, ordered after and before the current stream's work."""
        previous = self.streams.current_stream()
        stream.wait_stream(previous)
        with self.streams.use(stream):
            yield
        previous.wait_stream(stream)

    def run_eager(self, desc: GraphDescriptor, buffers: StepBuffers, lens, faults=(),
                  sync: DpSyncState | None = None) -> tuple[UbatchSlice, ...]:
        """An eager step on `buffers`, microbatched on threads when `desc` says so (split as
        the DP `sync` agreed); returns the split it ran."""
        if desc.microbatched:
            state = self.runner.prepare(buffers, lens,
                                        split_uct=split_uct_of(self.config, desc, sync))
            self.runner.run(self.model, self.cache, state, faults=faults)
            return state.slices
        self.model.forward(self._prepare_whole(buffers), self.cache)
        return (buffers.whole(),)

    def _prepare_whole(self, buffers: StepBuffers, for_replay: bool = False):
        return prepare_microbatch(buffers, self.whole_step_meta, buffers.whole(),
                                  **prepare_options(self.config, for_replay))

    def replay(self, desc: GraphDescriptor, requests, lens,
               layout: StagedLayout | None = None) -> tuple[UbatchSlice, ...]:
        """Refresh the graph's buffers in place, prepare the split, replay; returns the
        split prepared for this batch (to compare with the captured one). With a staged
        `layout` the real tokens are spread over every region, and restored after (§3.4)."""
        captured = self.lookup(desc)
        if layout is None:
            captured.buffers.fill(requests)
        else:
            lens = stage(captured.buffers, requests, layout, self.cache.scratch_slot)
        if desc.microbatched:
            split = self.runner.prepare(captured.buffers, lens, for_replay=True,
                                        split_uct=split_uct_of(self.config, desc, None)).slices
        else:
            self._prepare_whole(captured.buffers, for_replay=True)
            split = (captured.buffers.whole(),)
        captured.graph.replay()
        if layout is not None:
            restore(captured.buffers, requests, layout, self.config.mutation.staging_restore)
        for i, sl in enumerate(captured.split):  # the replay's routes are in the captured ones
            self.model.reserve(i, sl.num_tokens)
        return split

    def graph_bytes(self, key: GraphDescriptor) -> int:
        """Memory a graph (stored under `key`) holds for its persistent step buffers (what an
        unreachable twin wastes, besides its pool)."""
        b = self.captured[key].buffers
        tensors = (b.input_ids, b.positions, b.is_padding, b.query_start_loc, b.seq_lens,
                   b.slot_ids, b.computed, b.output)
        return sum(t.numel() * t.element_size() for t in tensors)
