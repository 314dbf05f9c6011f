"""Graph backends behind one interface: real CUDA graphs on GPUs, the emulation on CPU.

    graphs = make_graph_backend(streams)
    graph = graphs.new_graph()
    with graphs.capture(graph, capture_stream, pool=graphs.new_pool()):
        ...  # work issued on capture_stream (by any thread on it) is captured
    graph.replay()
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

import torch

from harness.runtime.emulated_graph import EmulatedGraph, EmulatedGraphs
from harness.runtime.graph_lifecycle import (
    CaptureError,
    GraphState,
    LifecycleGraph,
    ReplayError,
)
from harness.runtime.streams import CpuStreams, CudaStream, CudaStreams, Streams

__all__ = [
    "CaptureError", "CudaGraph", "CudaGraphs", "EmulatedGraph", "EmulatedGraphs", "Graph",
    "GraphBackend", "GraphState", "ReplayError", "make_graph_backend",
]

CUDA_EMPTY_GRAPH_WARNING = "The CUDA Graph is empty"


class Graph(Protocol):
    @property
    def state(self) -> GraphState: ...

    @property
    def num_ops(self) -> int | None: ...

    @property
    def is_empty(self) -> bool | None: ...

    def replay(self) -> None: ...


class GraphBackend(Protocol):
    def new_pool(self) -> Any: ...

    def new_graph(self) -> Graph: ...

    def capture(self, graph: Any, stream: Any,
                pool: Any = None) -> AbstractContextManager[Graph]: ...


class CudaGraph(LifecycleGraph):
    """torch.cuda.CUDAGraph with the life cycle of the emulated one."""

    def __init__(self) -> None:
        super().__init__()
        self.raw = torch.cuda.CUDAGraph()
        self._empty: bool | None = None

    @property
    def num_ops(self) -> int | None:
        """Unknown: torch does not expose a CUDA graph's node count."""
        return None

    @property
    def is_empty(self) -> bool | None:
        """Whether torch warned that the captured graph is empty (None before capture)."""
        return self._empty

    def replay(self) -> None:
        self._lifecycle.check_replayable()
        self.raw.replay()


class CudaGraphs:
    """torch.cuda.graph capture into graphs that share memory pools."""

    def __init__(self, streams: CudaStreams) -> None:
        self.streams = streams

    def new_pool(self) -> Any:
        return torch.cuda.graph_pool_handle()

    def new_graph(self) -> CudaGraph:
        return CudaGraph()

    @contextmanager
    def capture(self, graph: CudaGraph, stream: CudaStream,
                pool: Any = None) -> Iterator[CudaGraph]:
        graph._lifecycle.begin()
        failure: BaseException | None = None
        previous = torch.cuda.current_stream()
        # torch reports an empty capture only as a warning; catch it to answer `is_empty`.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            work_failure: BaseException | None = None
            try:
                with torch.cuda.graph(graph.raw, pool=pool, stream=stream.raw):
                    try:
                        yield graph
                    except BaseException as exc:
                        work_failure = exc
                        raise
            except BaseException as exc:
                # Work that fails inside the capture also fails torch's capture_end ("a
                # previous error during capture"); the work's own error says why.
                failure = work_failure if work_failure is not None else exc
            finally:
                # A capture that fails at its end leaves the capture stream current in torch.
                torch.cuda.set_stream(previous)
        for w in caught:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        if failure is not None:
            graph._lifecycle.invalidate(f"{type(failure).__name__}: {failure}")
            graph._lifecycle.end(raised=True)
            raise failure
        graph._empty = any(CUDA_EMPTY_GRAPH_WARNING in str(w.message) for w in caught)
        graph._lifecycle.end(raised=False)


def make_graph_backend(streams: Streams,
                       collective_timeout_s: float | None = None) -> GraphBackend:
    """Real CUDA graphs over CUDA streams; the emulation over CPU logical streams."""
    if isinstance(streams, CudaStreams):
        return CudaGraphs(streams)
    if isinstance(streams, CpuStreams):
        return EmulatedGraphs(streams, collective_timeout_s)
    raise CaptureError(f"no graph backend for {type(streams).__name__}")
