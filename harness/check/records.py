"""Step records: what each rank decided and did, as plain frozen data.

Checkers read only these (plus the reference); they never reach into a world. Tensors are
stored as nested tuples of floats so a record is serialisable and hashable.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from harness.sut.step_plan import StepPlan

Rows = tuple[tuple[float, ...], ...]
Fingerprint = tuple[tuple[str, tuple[int, ...]], ...]
Span = tuple[int, int, int, int]  # req_start, req_stop, tok_start, tok_stop


@dataclass(frozen=True)
class StepError:
    kind: str  # exception type name
    message: str
    cause: str | None = None  # the chained exception, "Type: message"

    def describe(self) -> str:
        text = f"{self.kind}: {self.message}"
        return f"{text} (caused by {self.cause})" if self.cause else text


@dataclass(frozen=True)
class GraphRecord:
    """One captured graph of one rank."""

    label: str
    num_ubatches: int
    empty: bool | None
    fingerprint: Fingerprint
    bytes: int
    reached_by: int | None  # a legal all-equal decode size that replays it; None: none does


@dataclass(frozen=True)
class StartupRecord:
    rank: int
    planned: tuple[str, ...]  # the graphs this rank's table captures, in capture order
    graphs: tuple[GraphRecord, ...]
    error: StepError | None
    threads_alive: tuple[str, ...]
    pending_run: bool
    seconds: float


@dataclass(frozen=True)
class StepRecord:
    rank: int
    step: int
    plan: StepPlan | None  # None when the rank failed before the DP sync returned
    executed: str  # "replay", "eager-microbatched", "eager", or "failed"
    captured_split: tuple[Span, ...]  # empty unless a graph was replayed
    replay_split: tuple[Span, ...]
    fingerprint: Fingerprint  # collectives this rank issued (or its graph replays)
    routes: tuple[tuple[int, int, int], ...]  # (source rank, token, expert) received, sorted
    outputs: Rows  # the real rows only
    state: Rows  # the whole per-request state cache after the step
    threads_alive: tuple[str, ...]
    pending_run: bool
    error: StepError | None
    injected_fault: bool
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        plan = self.plan
        data["plan"] = None if plan is None else {
            "kind": plan.kind, "graph": plan.desc.label(), "num_tokens": plan.num_tokens,
            "num_reqs": plan.num_reqs,
            "regions": [[r.tokens, r.real_tokens] for r in plan.regions]}
        for bulky in ("outputs", "state", "routes"):
            data.pop(bulky)
        return data


def span(sl) -> Span:
    return (sl.req_start, sl.req_stop, sl.tok_start, sl.tok_stop)


def error_of(exc: BaseException) -> StepError:
    cause = exc.__cause__
    return StepError(type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "",
                     None if cause is None else f"{type(cause).__name__}: {cause}")
