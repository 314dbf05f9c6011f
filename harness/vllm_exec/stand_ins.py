"""Everything vLLM's execution code needs that the machine lacks, in one place.

vLLM's runner, its ubatching contexts and its graph manager call `torch.cuda` streams,
events and graphs, pick a device per thread, reserve SMs, and ask vLLM's platform and
distributed state for the current stream, the graph pool, the pipeline group and the
capture context. The harness runs vLLM with its CPU platform (its CUDA platform needs the
compiled extensions), so on both kinds of rank these are replaced, on the vLLM module
objects under test only (never on torch itself):

- `create_sm_control_context`: a null context (vLLM's asserts a CUDA platform);
- `get_pp_group`: one pipeline stage; `graph_capture`: a fresh current stream for the
  capture, as vLLM's makes one, without its distributed groups; `capture_pool`: the pool as
  given (no cuMem pool, no NCCL allocator); `is_global_first_rank`: False (no progress bar);
- the platform's graph pool and vLLM's `current_stream` (the CPU platform has neither).

On a CPU rank (`CpuStandIns`) the machine lacks the rest too:

- streams and events: the harness's logical CPU streams (harness/runtime/streams.py), so
  every event record and wait is seen (and a stream being captured records its thread's ops);
- `torch.cuda.CUDAGraph` / `torch.cuda.graph`: the emulated graph (harness/runtime/
  emulated_graph.py), which records what is issued on the capture stream and replays it;
  each replay logs again the stream order its capture logged (docs/spec.md §11.1);
- `torch.accelerator.set_device_index`, `synchronize` and `current_blas_handle`: nothing
  to select, wait for or warm.

On a CUDA rank (`CudaStandIns`) streams, events, graphs and device calls are torch's own;
events are a subclass of `torch.Event` that logs each record and wait, and each capture is
observed (which collectives a graph holds, whether torch found it empty). On both, the
thread's device selection is where a scenario's set-up fault fires, before its context.

A rank is one process (vLLM's ubatching state is module-global), so one set per process.
"""

from __future__ import annotations

import abc
import contextlib
import itertools
import threading
import warnings
from collections.abc import Callable, Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import torch

from harness.runtime.emulated_graph import EmulatedGraph, EmulatedGraphs, EmulatedPool
from harness.runtime.graphs import CUDA_EMPTY_GRAPH_WARNING
from harness.runtime.streams import CpuStreams, LogicalEvent, LogicalStream
from harness.vllm_exec.stream_log import OFF, LoggedGraph, StreamLog


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


class _AcceleratorNamespace:
    """`torch.accelerator` with the set-up hook in front of the device selection; `real`:
    whether there is a device to select and wait for."""

    def __init__(self, stand_ins: _StandIns, real: bool) -> None:
        self._s = stand_ins
        self._real = real

    def set_device_index(self, index: Any) -> None:
        self._s.thread_setup()
        if self._real:
            torch.accelerator.set_device_index(index)

    def synchronize(self, *args: Any) -> None:
        if self._real:
            torch.accelerator.synchronize(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.accelerator, name)


class _TorchProxy:
    """torch for a vLLM module: its own `cuda`, `accelerator` and `Event`, the rest torch's."""

    def __init__(self, cuda: Any, accelerator: _AcceleratorNamespace) -> None:
        self.cuda = cuda
        self.accelerator = accelerator
        self.Event = cuda.Event

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


@contextlib.contextmanager
def _no_pool(pool: Any, vllm_config: Any) -> Iterator[Any]:
    yield pool


class _PlatformWithPool:
    """vLLM's (CPU) platform object, asked for the graph pool the rank's device has."""

    def __init__(self, platform: Any, pool: Any) -> None:
        self._platform = platform
        self._pool = pool

    def get_global_graph_pool(self) -> Any:
        return self._pool

    def __getattr__(self, name: str) -> Any:
        return getattr(self._platform, name)


class _StandIns(abc.ABC):
    """What both kinds of rank stand in; the device's own parts come from the subclass."""

    def __init__(self) -> None:
        self.thread_setup = _ThreadSetupHook()
        self.event_ids = itertools.count()
        self.event_log: list[str] = []  # list.append is atomic: threads share it
        self.stream_log: StreamLog = OFF  # tensor accesses beside the events: CPU ranks only
        # Entered around every capture (the runtime notes which collectives each graph holds).
        self.capture_observer: Callable[[Any], Any] = contextlib.nullcontext
        self._streams_made = itertools.count()
        self.installed: list[ModuleType] = []

    def next_stream_name(self) -> str:
        # Each UBatchRunner builds its comm stream, then its capture stream (ubatch_utils.py).
        n = next(self._streams_made)
        return f"vllm-{('comm', 'capture')[n % 2]}-{n // 2}"

    def install(self, ubatching: ModuleType, ubatch_utils: ModuleType,
                cudagraph_utils: ModuleType) -> None:
        """Point the three modules' names at the stand-ins (idempotent per module). Where
        vLLM's own CUDA platform is active (a full install on a GPU host), its current
        stream, SM control and graph pool are used, not stood in."""
        platform_stood_in = not cudagraph_utils.current_platform.is_cuda()
        for module in (ubatching, ubatch_utils, cudagraph_utils):
            if module in self.installed:
                continue
            module.torch = self.proxy
            if platform_stood_in:
                module.current_stream = self.current_stream
            self.installed.append(module)
        cudagraph_utils.get_pp_group = lambda: SimpleNamespace(is_first_rank=True,
                                                               is_last_rank=True)
        cudagraph_utils.graph_capture = self.graph_capture
        cudagraph_utils.capture_pool = _no_pool
        cudagraph_utils.is_global_first_rank = lambda: False
        if not platform_stood_in:
            return
        # vLLM's SM control object is entered once per run: a reusable null context.
        ubatch_utils.create_sm_control_context = lambda parallel_config: contextlib.nullcontext()
        if not isinstance(cudagraph_utils.current_platform, _PlatformWithPool):
            cudagraph_utils.current_platform = _PlatformWithPool(
                cudagraph_utils.current_platform, self.pool)

    # Supplied by each kind of rank.
    proxy: _TorchProxy
    pool: Any

    @abc.abstractmethod
    def current_stream(self) -> Any:
        """vLLM's `current_stream()`: the calling thread's current stream."""

    @abc.abstractmethod
    def graph_capture(self, device: Any = None,
                      stream: Any = None) -> contextlib.AbstractContextManager:
        """vLLM's `graph_capture` context, without its distributed groups; 0.34 passes the
        stream of an earlier capture to capture on it again (None: a fresh one)."""

    @abc.abstractmethod
    def is_empty(self, graph: Any) -> bool | None:
        """Whether a captured graph holds no work (None when unknown)."""


# -- a CPU rank --------------------------------------------------------------------------


class _TracedEvent(LogicalEvent):
    """A logical event whose every record and wait lands in the process's event log."""

    def __init__(self, stand_ins: CpuStandIns, name: str) -> None:
        super().__init__(stand_ins.streams, name)
        self._log = stand_ins.event_log
        self._order = stand_ins.stream_log

    def record(self, stream: LogicalStream | None = None) -> None:
        super().record(stream)
        self._log.append(f"record {self.name} on {self.last_recorded_on}")
        self._order.event("record", self.last_recorded_on, self.name)

    def wait(self, stream: LogicalStream | None = None) -> None:
        super().wait(stream)
        on = self.runtime.resolve(stream).name
        self._order.event("wait", on, self.name)
        self._log.append(f"wait {self.name} on {on}" + ("" if self.num_records else
                                                          " (never recorded)"))


class _CpuCuda:
    """`torch.cuda` as vLLM's execution code calls it, over logical streams and emulated
    graphs; any other attribute is torch's own."""

    def __init__(self, stand_ins: CpuStandIns) -> None:
        self._s = stand_ins

    def Stream(self, device: Any = None, priority: int = 0) -> LogicalStream:
        return self._s.streams.new_stream(self._s.next_stream_name())

    def Event(self, *args: Any, **kwargs: Any) -> LogicalEvent:
        return _TracedEvent(self._s, f"event-{next(self._s.event_ids)}")

    def set_stream(self, stream: LogicalStream) -> None:
        self._s.streams.set_current_stream(stream)

    def stream(self, stream: LogicalStream):
        return self._s.streams.use(stream)

    def current_blas_handle(self) -> None:
        return None

    def CUDAGraph(self) -> EmulatedGraph:
        return LoggedGraph(self._s.stream_log, self._s.graphs.collective_timeout_s)

    @contextlib.contextmanager
    def graph(self, graph: EmulatedGraph, pool: Any = None, stream: LogicalStream | None = None,
              **kwargs: Any) -> Iterator[EmulatedGraph]:
        mark = self._s.stream_log.mark()
        with self._s.capture_observer(graph), self._s.graphs.capture(graph, stream, pool=pool):
            yield graph
        if isinstance(graph, LoggedGraph):
            graph.captured_order(self._s.stream_log.since(mark))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


class CpuStandIns(_StandIns):
    """The stand-ins of one CPU rank process."""

    def __init__(self, collective_timeout_s: float) -> None:
        super().__init__()
        self.streams = CpuStreams("cpu")
        self.stream_log = StreamLog(self.current_stream)
        self.graphs = EmulatedGraphs(self.streams, collective_timeout_s)
        self.pool = EmulatedPool()
        self.proxy = _TorchProxy(_CpuCuda(self), _AcceleratorNamespace(self, real=False))

    def current_stream(self) -> LogicalStream:
        return self.streams.current_stream()

    @contextlib.contextmanager
    def graph_capture(self, device: Any = None, stream: Any = None) -> Iterator[SimpleNamespace]:
        """A fresh non-default stream (or the one given) is current for the capture (graphs
        that are not split are captured on it)."""
        stream = stream or self.streams.new_stream("vllm-graph-capture")
        with self.streams.use(stream):
            yield SimpleNamespace(stream=stream)

    def is_empty(self, graph: EmulatedGraph) -> bool:
        return graph.is_empty


# -- a CUDA rank -------------------------------------------------------------------------


class _LoggedCudaEvent(torch.Event):
    """A CUDA event whose every record and wait lands in the process's event log (streams
    call `event.wait(stream)` from `wait_event`, so both directions are seen)."""

    def __new__(cls, stand_ins: CudaStandIns, name: str) -> _LoggedCudaEvent:
        return super().__new__(cls, stand_ins.device)  # torch's type takes only the device

    def __init__(self, stand_ins: CudaStandIns, name: str) -> None:
        self.name = name
        self._s = stand_ins
        self.num_records = 0

    def record(self, stream: Any = None) -> None:
        stream = stream if stream is not None else torch.cuda.current_stream()
        super().record(stream)
        self.num_records += 1
        self._s.event_log.append(f"record {self.name} on {self._s.stream_name(stream)}")

    def wait(self, stream: Any = None) -> None:
        stream = stream if stream is not None else torch.cuda.current_stream()
        super().wait(stream)
        self._s.event_log.append(f"wait {self.name} on {self._s.stream_name(stream)}"
                                 + ("" if self.num_records else " (never recorded)"))


class _ObservedCuda:
    """torch.cuda with logged events, named streams and observed captures."""

    def __init__(self, stand_ins: CudaStandIns) -> None:
        self._s = stand_ins

    def Stream(self, device: Any = None, priority: int = 0) -> torch.cuda.Stream:
        stream = torch.cuda.Stream(device=device, priority=priority)
        self._s.name_stream(stream, self._s.next_stream_name())
        return stream

    def Event(self, *args: Any, **kwargs: Any) -> _LoggedCudaEvent:
        return _LoggedCudaEvent(self._s, f"event-{next(self._s.event_ids)}")

    @contextlib.contextmanager
    def graph(self, graph: torch.cuda.CUDAGraph, pool: Any = None, stream: Any = None,
              **kwargs: Any) -> Iterator[torch.cuda.CUDAGraph]:
        # torch reports an empty capture only as a warning, at the capture's end.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with self._s.capture_observer(graph), torch.cuda.graph(graph, pool, stream,
                                                                   **kwargs):
                yield graph
        self._s.empty[id(graph)] = any(CUDA_EMPTY_GRAPH_WARNING in str(w.message)
                                       for w in caught)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


class CudaStandIns(_StandIns):
    """The stand-ins of one CUDA rank process: only vLLM's platform and distributed state."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.stream_names: dict[int, str] = {}
        self.streams_made: list[torch.cuda.Stream] = []
        self.empty: dict[int, bool] = {}
        self.proxy = _TorchProxy(_ObservedCuda(self), _AcceleratorNamespace(self, real=True))

    def name_stream(self, stream: torch.cuda.Stream, name: str) -> None:
        self.stream_names[stream.stream_id] = name
        self.streams_made.append(stream)

    def all_streams(self) -> list[torch.cuda.Stream]:
        """Every stream vLLM's code made here and the calling thread's current one: the work
        the rank has queued on its device (harness/runtime/device_fence.py waits for it)."""
        return [*self.streams_made, torch.cuda.current_stream(self.device)]

    def join_streams(self) -> None:
        """Order the current stream after all work vLLM's code queued on its own streams: the
        capture's warm-up writes the state on the capture stream, and the harness resets it
        on the current one (a race the CUDA sanitizer found)."""
        current = torch.cuda.current_stream(self.device)
        for stream in self.streams_made:
            current.wait_stream(stream)

    def stream_name(self, stream: torch.cuda.Stream) -> str:
        return self.stream_names.get(stream.stream_id, f"cuda-stream-{stream.stream_id}")

    def current_stream(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream()

    @contextlib.contextmanager
    def graph_capture(self, device: Any = None, stream: Any = None) -> Iterator[SimpleNamespace]:
        """A fresh stream (or the one given), ordered after the current one's work, is current
        for the capture (the default stream cannot be captured on)."""
        if stream is None:
            stream = torch.cuda.Stream(device=self.device)
            self.name_stream(stream, "vllm-graph-capture")
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            yield SimpleNamespace(stream=stream)

    def is_empty(self, graph: torch.cuda.CUDAGraph) -> bool | None:
        return self.empty.get(id(graph))


_INSTANCE: _StandIns | None = None
_LOCK = threading.Lock()


def stand_ins_for(device: torch.device, collective_timeout_s: float) -> _StandIns:
    """This process's stand-ins (one rank per process; the first device and timeout stay)."""
    global _INSTANCE
    with _LOCK:
        if _INSTANCE is None:
            _INSTANCE = (CpuStandIns(collective_timeout_s) if device.type == "cpu"
                         else CudaStandIns(device))
        return _INSTANCE
