"""The bounds every wait of a world runs under: collectives, microbatch turns, steps."""

from __future__ import annotations

from dataclasses import dataclass

from harness.errors import ConfigError

DEVICE_MARGIN_S = 0.5


@dataclass(frozen=True)
class Timeouts:
    collective_s: float = 5.0  # gloo group timeout and every all-to-all wait
    hang_s: float = 10.0  # a microbatch waiting this long for its turn is a hang
    step_deadline_s: float = 30.0  # a rank's whole step

    def __post_init__(self) -> None:
        # A microbatch waits for its turn while its sibling may sit in a collective that is
        # about to time out: the turn wait must outlast it, or a clean failure reads as a hang.
        if self.hang_s <= self.collective_s:
            raise ConfigError("hang_timeout", f"{self.hang_s} s must exceed the collective "
                              f"timeout {self.collective_s} s")
        if self.step_deadline_s <= self.hang_s + self.collective_s:
            raise ConfigError("deadline", f"{self.step_deadline_s} s must exceed the hang plus "
                              f"collective timeouts ({self.hang_s + self.collective_s} s)")

    @property
    def startup_deadline_s(self) -> float:
        return 4 * self.step_deadline_s

    def with_device_fence(self) -> Timeouts:
        """The bounds of a world whose ranks wait for their GPU work after each step (NCCL):
        a step that failed on a collective may then wait one more collective bound before
        its device counts as wedged. `DEVICE_MARGIN_S` covers polling and launches."""
        hang = max(self.hang_s, self.collective_s + DEVICE_MARGIN_S)
        deadline = max(self.step_deadline_s, hang + 2 * self.collective_s + DEVICE_MARGIN_S)
        return Timeouts(self.collective_s, hang, deadline)


DEFAULT_TIMEOUTS = Timeouts()
