"""Errors the harness reports to its users as one line, and where a rank's failure came from."""

import enum


class ConfigError(ValueError):
    """A config, scenario or flag that no real system allows; names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class HarnessCannot(RuntimeError):
    """The harness itself cannot do what was asked (an installed vLLM whose API it does not
    know, a world that would not start, a runtime it could not build, a checker that raised):
    one line naming what, and its own exit code. Never a finding of the system under test.
    A message's lines after its first, and `detail` (a traceback, a log), are kept apart."""

    def __init__(self, what: str, message: str, detail: str = "") -> None:
        first, _, rest = message.strip().partition("\n")
        super().__init__(f"{what}: {first}")
        self.what = what
        self.message = first
        self.detail = "\n".join(part for part in (rest.strip(), detail.strip()) if part)


def one_line(exc: BaseException) -> str:
    """`exc` as "Kind: the first line of its message" (a HarnessCannot as its own line)."""
    if isinstance(exc, HarnessCannot):
        return str(exc)
    text = str(exc).strip().partition("\n")[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def cannot_of(exc: BaseException, what: str, doing: str, detail: str = "") -> HarnessCannot:
    """`exc`, raised by the harness's own code while `doing`, as the HarnessCannot to report
    (one that already is one keeps its line); `detail` (a traceback) is added to its own."""
    if isinstance(exc, HarnessCannot):
        return (HarnessCannot(exc.what, exc.message, f"{exc.detail}\n{detail}") if detail
                else exc)
    return HarnessCannot(what, f"{doing}: {one_line(exc)}", detail)


def last_line(traceback_text: str) -> str:
    """The exception line a formatted traceback ends with ("" for none)."""
    lines = [line for line in traceback_text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


class ErrorOrigin(enum.Enum):
    """Where a rank's failure came from, carried as data so no code reads message text."""

    INJECTED = "injected"  # a scenario's fault, or a failure it caused
    KILLED = "killed"  # the rank's process was killed by an injected fault
    LOST = "lost"  # the rank's process vanished (ended by torchrun after a peer died)
    CRASHED = "crashed"  # the rank's process died of a fatal signal of its own (abort, segfault)
    NODE_LOST = "node-lost"  # the rank's node died (its torchrun agent or the machine)
    TIMEOUT = "timeout"  # a bounded wait on a peer ran out (a collective, the device)
    HANG = "hang"  # a microbatch or a rank never got its turn back within its deadline
    ABORTED = "aborted"  # a microbatch stopped because its sibling failed
    RAISED = "raised"  # the system under test raised an error of its own
