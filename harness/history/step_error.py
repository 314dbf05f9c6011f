"""A rank's failure as data: the exception's type, first line, cause, and origin."""

from __future__ import annotations

from dataclasses import dataclass

from harness.errors import ErrorOrigin


@dataclass(frozen=True)
class StepError:
    kind: str  # exception type name
    message: str
    cause: str | None = None  # the chained exception, "Type: message"
    origin: ErrorOrigin = ErrorOrigin.RAISED

    def describe(self) -> str:
        text = f"{self.kind}: {self.message}"
        return f"{text} (caused by {self.cause})" if self.cause else text


def origin_of(exc: BaseException) -> ErrorOrigin:
    """An exception's own `origin`, else its cause's (a wrapper keeps what it wraps)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        origin = getattr(exc, "origin", None)
        if isinstance(origin, ErrorOrigin):
            return origin
        exc = exc.__cause__
    return ErrorOrigin.RAISED


def error_of(exc: BaseException) -> StepError:
    cause = exc.__cause__
    message = str(exc).splitlines()[0] if str(exc) else ""
    races = [_race_line(e) for e in getattr(exc, "errors", None) or ()
             if hasattr(e, "current_access") and hasattr(e, "previous_access")]
    if races:  # torch's CUDA sanitizer: its first line only counts; name the two accesses
        message = f"{message}: {'; '.join(races)}"
    return StepError(type(exc).__name__, message,
                     None if cause is None else f"{type(cause).__name__}: {cause}",
                     origin_of(exc))


def _race_line(race) -> str:
    """One of TORCH_CUDA_SANITIZER's unsynchronized-access errors on a line: each access's
    stream, operator and innermost frame of the harness or vLLM."""
    now, before = race.current_access, race.previous_access
    return (f"stream {now.stream} {_op(now)} {now.type} at {_our_frame(now)} races "
            f"stream {before.stream} {_op(before)} {before.type} at {_our_frame(before)}")


def _op(access) -> str:
    return str(access.operator).split("(", 1)[0]  # the name; its schema would fill the line


def _our_frame(access) -> str:
    frames = list(getattr(access, "stack_trace", None) or ())
    ours = [f for f in frames if "/harness/" in f.filename or "/vllm/" in f.filename] or frames
    if not ours:
        return "?"
    frame = ours[-1]
    return f"{frame.filename.rsplit('/', 2)[-2]}/{frame.filename.rsplit('/', 1)[-1]}:" \
        f"{frame.lineno} ({frame.name})"
