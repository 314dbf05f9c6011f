"""Faults a scenario injects into the system under test (the nemesis), as plain data."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from harness.errors import ErrorOrigin


class FaultKind(enum.Enum):
    RAISE_IN_UBATCH = "raise_in_ubatch"  # the microbatch raises after its first yield
    RETURN_WITHOUT_YIELDING = "return_without_yielding"  # the microbatch skips its MoE layer
    SKIP_SYNC = "skip_sync"  # the rank skips the DP sync all-reduce
    SLOW_RANK = "slow_rank"  # the rank sleeps `seconds` before the step
    # The rank's process is killed mid-step (torchrun world, or the sim world's sandbox).
    KILL_RANK = "kill_rank"
    # The rank's process aborts after the DP sync, as a native library's failed check does
    # (SIGABRT; torchrun world, or the sim world's sandbox, where every rank's process ends).
    ABORT_RANK = "abort_rank"


class InjectedFault(RuntimeError):
    """The error a scenario's fault makes a rank or a microbatch raise."""

    origin = ErrorOrigin.INJECTED


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    rank: int
    step: int
    ubatch: int = 0
    seconds: float = 0.0
