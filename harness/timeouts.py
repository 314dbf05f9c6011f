"""The bounds every wait of a world runs under: collectives, microbatch turns, steps."""

from __future__ import annotations

from dataclasses import dataclass

from harness.errors import ConfigError

DEVICE_MARGIN_S = 0.5
# Past a bound the waited-for side enforces itself, for its message or its exit to reach the
# waiting side on a loaded machine: the waiter never calls a hang the other side would name.
DRIVER_SLACK_S = 5.0


def gloo_init_wait_s(collective_s: float) -> float:
    """Thread ranks building their gloo groups (a rendezvous under the collective bound)."""
    return collective_s + DRIVER_SLACK_S


def thread_run_wait_s(collective_s: float) -> float:
    """Thread ranks running a call of their own (a constructor, one exchange) with no bound
    given: two collectives."""
    return 2 * collective_s + DRIVER_SLACK_S


def microbatch_join_wait_s(hang_s: float) -> float:
    """A run's microbatch threads joining: each waits at most a hang bound for its turn."""
    return hang_s + DRIVER_SLACK_S


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
    def overdue_s(self) -> float:
        """When a rank whose waits have no bound (vLLM's execution code) says its step is
        overdue, proving a hang: the step deadline, which liveness judges by and which a
        step's bounded waits cannot reach (a turn wait outlasting a timing-out collective,
        hang + collective, is less). `step_wait_s` adds the slack only for a rank that
        cannot speak (harness/world/torchrun/step_watch.py)."""
        return self.step_deadline_s

    @property
    def startup_deadline_s(self) -> float:
        return 4 * self.step_deadline_s

    @property
    def step_wait_s(self) -> float:
        """The driver's wait for a rank's step (its records, or its thread)."""
        return self.step_deadline_s + DRIVER_SLACK_S

    @property
    def gloo_init_wait_s(self) -> float:
        return gloo_init_wait_s(self.collective_s)

    @property
    def thread_run_wait_s(self) -> float:
        return thread_run_wait_s(self.collective_s)

    @property
    def sandbox_startup_wait_s(self) -> float:
        """The sandboxed sim world's first reply to a scenario: its groups (gloo init), its
        runtimes (a thread run) and their capture (the start-up deadline), in that order."""
        return self.startup_deadline_s + 3 * self.collective_s + 2 * DRIVER_SLACK_S

    def batch_wait_s(self, steps: int) -> float:
        """The driver's wait for a batched scenario's records: every step's deadline."""
        return steps * self.step_deadline_s + DRIVER_SLACK_S

    def with_device_fence(self) -> Timeouts:
        """The bounds of a world whose ranks wait for their GPU work after each step (NCCL):
        a step that failed on a collective may then wait one more collective bound before
        its device counts as wedged. `DEVICE_MARGIN_S` covers polling and launches."""
        hang = max(self.hang_s, self.collective_s + DEVICE_MARGIN_S)
        deadline = max(self.step_deadline_s, hang + 2 * self.collective_s + DEVICE_MARGIN_S)
        return Timeouts(self.collective_s, hang, deadline)


DEFAULT_TIMEOUTS = Timeouts()
