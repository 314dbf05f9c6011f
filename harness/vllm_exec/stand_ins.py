"""Everything vLLM's execution code needs that a CPU machine lacks, in one place.

vLLM's runner, its ubatching contexts and its graph manager call `torch.cuda` streams,
events and graphs, pick a device per thread, reserve SMs, and ask vLLM's distributed state
for the pipeline group and the capture context. On a CPU rank each of these is replaced,
on the vLLM module objects under test only (never on torch itself), by:

- streams and events: the harness's logical CPU streams (harness/runtime/streams.py), so
  every event record and wait is seen (and a stream being captured records its thread's ops);
- `torch.cuda.CUDAGraph` / `torch.cuda.graph`: the emulated graph (harness/runtime/
  emulated_graph.py), which records what is issued on the capture stream and replays it;
- `torch.accelerator.set_device_index` and `current_blas_handle`: nothing to select or warm on
  a CPU (the first is also where a scenario's set-up fault fires, before the thread's context);
- `create_sm_control_context`: a null context (there are no SMs to reserve);
- `get_pp_group`: one pipeline stage; `graph_capture`: a fresh current stream for the capture,
  as vLLM's makes one, without its distributed groups; `capture_pool`: the pool as given (no
  cuMem pool, no NCCL allocator); `is_global_first_rank`: False (no progress bar).

A rank is one process (vLLM's ubatching state is module-global), so one set per process.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import torch

from harness.runtime.emulated_graph import EmulatedGraph, EmulatedGraphs, EmulatedPool
from harness.runtime.streams import CpuStreams, LogicalEvent, LogicalStream


class _ThreadSetupHook:
    """What runs where a microbatch thread selects its device: a fault, when one is armed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: Callable[[int], None] | None = None
        self._calls = 0

    def arm(self, hook: Callable[[int], None] | None) -> None:
        with self._lock:
            self._armed, self._calls = hook, 0

    def __call__(self) -> None:
        with self._lock:
            hook, order = self._armed, self._calls
            self._calls += 1
        if hook is not None:
            hook(order)  # the order in which this run's threads reached their set-up


class _TracedEvent(LogicalEvent):
    """A logical event whose every record and wait lands in the process's event log."""

    def __init__(self, stand_ins: CpuStandIns, name: str) -> None:
        super().__init__(stand_ins.streams, name)
        self._log = stand_ins.event_log

    def record(self, stream: LogicalStream | None = None) -> None:
        super().record(stream)
        self._log.append(f"record {self.name} on {self.last_recorded_on}")

    def wait(self, stream: LogicalStream | None = None) -> None:
        super().wait(stream)
        on = self.runtime.resolve(stream).name
        self._log.append(f"wait {self.name} on {on}" + ("" if self.num_records else
                                                          " (never recorded)"))


class _CudaNamespace:
    """`torch.cuda` as vLLM's execution code calls it, over logical streams and emulated
    graphs; any other attribute is torch's own."""

    def __init__(self, stand_ins: CpuStandIns) -> None:
        self._s = stand_ins

    def Stream(self, device: Any = None, priority: int = 0) -> LogicalStream:  # noqa: N802
        return self._s.new_stream()

    def Event(self, *args: Any, **kwargs: Any) -> LogicalEvent:  # noqa: N802
        return _TracedEvent(self._s, f"event-{next(self._s.event_ids)}")

    def set_stream(self, stream: LogicalStream) -> None:
        self._s.streams.set_current_stream(stream)

    def stream(self, stream: LogicalStream):
        return self._s.streams.use(stream)

    def current_blas_handle(self) -> None:
        return None

    def CUDAGraph(self) -> EmulatedGraph:  # noqa: N802
        return self._s.graphs.new_graph()

    @contextlib.contextmanager
    def graph(self, graph: EmulatedGraph, pool: Any = None, stream: LogicalStream | None = None,
              **kwargs: Any) -> Iterator[EmulatedGraph]:
        with self._s.capture_observer(graph), self._s.graphs.capture(graph, stream, pool=pool):
            yield graph

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


class _AcceleratorNamespace:
    def __init__(self, stand_ins: CpuStandIns) -> None:
        self._s = stand_ins

    def set_device_index(self, index: Any) -> None:
        self._s.thread_setup()

    def synchronize(self, *args: Any) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.accelerator, name)


class _TorchProxy:
    """torch for a vLLM module: its own `cuda`, `accelerator` and `Event`, the rest torch's."""

    def __init__(self, stand_ins: CpuStandIns) -> None:
        self.cuda = _CudaNamespace(stand_ins)
        self.accelerator = _AcceleratorNamespace(stand_ins)
        self.Event = self.cuda.Event

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


@contextlib.contextmanager
def _null_context(*args: Any, **kwargs: Any) -> Iterator[None]:
    yield None


@contextlib.contextmanager
def _no_pool(pool: Any, vllm_config: Any) -> Iterator[Any]:
    yield pool


class CpuStandIns:
    """The CPU stand-ins of one rank process, installed into vLLM's execution modules."""

    def __init__(self, collective_timeout_s: float) -> None:
        self.streams = CpuStreams("cpu")
        self.graphs = EmulatedGraphs(self.streams, collective_timeout_s)
        self.pool = EmulatedPool()
        self.thread_setup = _ThreadSetupHook()
        self._streams_made = itertools.count()
        self.event_ids = itertools.count()
        self.event_log: list[str] = []  # list.append is atomic: threads share it
        # Entered around every capture (the runtime notes which collectives each graph holds).
        self.capture_observer: Callable[[EmulatedGraph], Any] = _null_context
        self._proxy = _TorchProxy(self)
        self.installed: list[ModuleType] = []

    def new_stream(self) -> LogicalStream:
        # Each UBatchRunner builds its comm stream, then its capture stream (ubatch_utils.py).
        n = next(self._streams_made)
        return self.streams.new_stream(f"vllm-{('comm', 'capture')[n % 2]}-{n // 2}")

    @contextlib.contextmanager
    def _graph_capture(self, device: Any = None) -> Iterator[SimpleNamespace]:
        """vLLM's graph_capture without its distributed groups: a fresh non-default stream
        is current for the capture (graphs that are not split are captured on it)."""
        stream = self.streams.new_stream("vllm-graph-capture")
        with self.streams.use(stream):
            yield SimpleNamespace(stream=stream)

    def install(self, ubatching: ModuleType, ubatch_utils: ModuleType,
                cudagraph_utils: ModuleType) -> None:
        """Point the three modules' names at the stand-ins (idempotent per module)."""
        for module in (ubatching, ubatch_utils, cudagraph_utils):
            if module in self.installed:
                continue
            module.torch = self._proxy
            module.current_stream = self.streams.current_stream
            self.installed.append(module)
        # vLLM's SM control object is entered once per run: a reusable null context.
        ubatch_utils.create_sm_control_context = lambda parallel_config: contextlib.nullcontext()
        cudagraph_utils.get_pp_group = lambda: SimpleNamespace(is_first_rank=True,
                                                               is_last_rank=True)
        cudagraph_utils.graph_capture = self._graph_capture
        cudagraph_utils.capture_pool = _no_pool
        cudagraph_utils.is_global_first_rank = lambda: False
        cudagraph_utils.current_platform = _PlatformWithPool(cudagraph_utils.current_platform,
                                                             self.pool)


class _PlatformWithPool:
    """vLLM's platform object, asked for a graph pool a CPU does not have."""

    def __init__(self, platform: Any, pool: EmulatedPool) -> None:
        self._platform = platform
        self._pool = pool

    def get_global_graph_pool(self) -> EmulatedPool:
        return self._pool

    def __getattr__(self, name: str) -> Any:
        return getattr(self._platform, name)


_INSTANCE: CpuStandIns | None = None
_LOCK = threading.Lock()


def cpu_stand_ins(collective_timeout_s: float) -> CpuStandIns:
    """This process's stand-ins (one rank per process; the first timeout given stays)."""
    global _INSTANCE
    with _LOCK:
        if _INSTANCE is None:
            _INSTANCE = CpuStandIns(collective_timeout_s)
        return _INSTANCE
