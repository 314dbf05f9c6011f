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
    return StepError(type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "",
                     None if cause is None else f"{type(cause).__name__}: {cause}",
                     origin_of(exc))
