"""The life of a graph, shared by every backend: new, capturing, then captured or failed."""

from __future__ import annotations

import enum


class GraphError(RuntimeError):
    """A graph used against its life cycle or a capture that went wrong."""


class CaptureError(GraphError):
    """A capture was invalidated (host sync, unjoined stream, ...) or cannot start."""


class ReplayError(GraphError):
    """Replay of a graph that is not (successfully) captured."""


class GraphState(enum.Enum):
    NEW = "new"
    CAPTURING = "capturing"
    CAPTURED = "captured"
    FAILED = "failed"


class Lifecycle:
    """Enforces the legal transitions and remembers why a capture failed."""

    def __init__(self) -> None:
        self.state = GraphState.NEW
        self.failure: str | None = None

    def begin(self) -> None:
        if self.state is not GraphState.NEW:
            raise CaptureError(f"a graph is captured once; this one is {self.state.value}")
        self.state = GraphState.CAPTURING

    def invalidate(self, reason: str) -> None:
        """Record the first reason the capture cannot succeed; later ones add nothing."""
        if self.failure is None:
            self.failure = reason

    def end(self, raised: bool) -> None:
        self.state = GraphState.FAILED if raised or self.failure else GraphState.CAPTURED

    def check_replayable(self) -> None:
        if self.state is GraphState.CAPTURED:
            return
        if self.state is GraphState.FAILED:
            why = f": {self.failure}" if self.failure else ""
            raise ReplayError(f"cannot replay a graph whose capture failed{why}")
        raise ReplayError(f"cannot replay a graph that is {self.state.value}, not captured")


class LifecycleGraph:
    """What every graph backend's graph exposes about its capture: the state and why it failed."""

    def __init__(self) -> None:
        self._lifecycle = Lifecycle()

    @property
    def state(self) -> GraphState:
        return self._lifecycle.state

    @property
    def failure(self) -> str | None:
        return self._lifecycle.failure
