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
    know, a lane this machine cannot run): one line naming what, and its own exit code."""

    def __init__(self, what: str, message: str) -> None:
        super().__init__(f"{what}: {message}")
        self.what = what
        self.message = message


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
