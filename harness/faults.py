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
    # Stages of a microbatch thread's life under vLLM's own runner (`exec: vllm` only).
    RAISE_IN_DISPATCH = "raise_in_dispatch"  # before its dispatch all-to-all is issued
    RAISE_IN_COMBINE = "raise_in_combine"  # before its combine all-to-all is issued
    RAISE_IN_RECV_HOOK = "raise_in_recv_hook"  # in its receive hook, wherever that runs
    RAISE_IN_SETUP = "raise_in_setup"  # where its thread selects the device, before its context
    SLOW_UBATCH = "slow_ubatch"  # it sleeps `seconds` after its first handoff


# The faults only vLLM's execution path injects (the stages of vLLM's microbatch threads).
VLLM_EXEC_FAULTS = (FaultKind.RAISE_IN_DISPATCH, FaultKind.RAISE_IN_COMBINE,
                    FaultKind.RAISE_IN_RECV_HOOK, FaultKind.RAISE_IN_SETUP,
                    FaultKind.SLOW_UBATCH)
# Faults that sleep rather than fail, for `seconds`.
SLEEPING_FAULTS = (FaultKind.SLOW_RANK, FaultKind.SLOW_UBATCH)


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
