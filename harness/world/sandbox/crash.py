"""What the sandboxed sim world hands back when the process its ranks share dies mid-scenario:
a named failure on every rank at the step it died in, never the end of the run.

The ranks are threads of that one process, so a native abort takes all of them at once and
which rank's call tripped it cannot be told apart: every rank is named with the collective
it last issued (its trace, written before each call), with the signal and gloo's own message.
A fault the scenario injected names its rank; the others died with it.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence

from harness.errors import ErrorOrigin
from harness.faults import FaultKind
from harness.history.records import StartupRecord, StepRecord
from harness.history.scenario_history import ScenarioHistory
from harness.history.step_error import StepError
from harness.scenario import Scenario
from harness.timeouts import Timeouts


def describe_exit(returncode: int | None) -> str:
    """"SIGABRT: Aborted" for a signal, "exit status 1" otherwise."""
    if returncode is None:
        return "an unknown cause (its exit status could not be read)"
    if returncode < 0:
        try:
            sig = signal.Signals(-returncode)
        except ValueError:
            return f"signal {-returncode}"
        return f"{sig.name}: {signal.strsignal(sig)}"
    return f"exit status {returncode}"


def crash_errors(scenario: Scenario, step: int | None, returncode: int | None,
                 last: Mapping[int, str | None], native: str | None) -> list[StepError]:
    """Each rank's error when the shared process died at `step` (None: during capture)."""
    n = scenario.config.serving.dp_size
    how = describe_exit(returncode)
    faults = [f for f in scenario.faults if f.step == step]
    ending = [f for f in faults if f.kind in (FaultKind.ABORT_RANK, FaultKind.KILL_RANK)]
    if ending:
        fault = ending[0]
        errors = [StepError("RankLost", f"lost its process with rank {fault.rank}'s (the sim "
                            "world's ranks share one)", None, ErrorOrigin.LOST)] * n
        if fault.kind is FaultKind.KILL_RANK:
            errors[fault.rank] = StepError("RankKilled", "was killed (injected kill_rank)",
                                           None, ErrorOrigin.KILLED)
        else:
            where = last.get(fault.rank)
            errors[fault.rank] = StepError(
                "RankCrashed", f"died of a fatal signal ({how}); "
                + (f"its last collective: {where}" if where
                   else "before any collective of its step"), native, ErrorOrigin.INJECTED)
        return errors
    issued = "; ".join(f"rank {r} {last.get(r) or 'none yet'}" for r in range(n))
    message = (f"died of a fatal signal ({how}) with every rank of the sim world, which share "
               f"one process, so which rank's call tripped it is not known; each rank's last "
               f"collective: {issued}")
    return [StepError("RankCrashed", message, native, ErrorOrigin.CRASHED)] * n


def crashed_history(scenario: Scenario, timeouts: Timeouts,
                    startup: Sequence[StartupRecord | None] | None,
                    steps: Sequence[Sequence[StepRecord | None]], returncode: int | None,
                    last: Mapping[int, str | None], native: str | None,
                    evidence: str) -> ScenarioHistory:
    """The history of a scenario whose process died after the records it sent."""
    n = scenario.config.serving.dp_size
    if startup is None:  # died in capture: the start-up records carry the crash
        errors = crash_errors(scenario, None, returncode, last, native)
        crashed = tuple(StartupRecord(r, (), (), errors[r], (), False, 0.0) for r in range(n))
        return ScenarioHistory(scenario, timeouts, crashed, (), evidence)
    # A death after the last step's records came back is charged to that step.
    index = min(len(steps), len(scenario.steps) - 1)
    errors = crash_errors(scenario, index, returncode, last, native)
    failed = tuple(StepRecord.failed(r, index, errors[r],
                                     injected_fault=errors[r].origin is not ErrorOrigin.CRASHED
                                     and errors[r].origin is not ErrorOrigin.LOST)
                   for r in range(n))
    kept = tuple(tuple(s) for s in steps[:index])
    return ScenarioHistory(scenario, timeouts, tuple(startup), (*kept, failed), evidence)
