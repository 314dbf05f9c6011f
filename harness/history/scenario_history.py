"""What a world hands back for one scenario: every rank's start-up and step records, and
the evidence of a hang or crash. Worlds stop by the two predicates here; they never judge."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.history.records import StartupRecord, StepRecord
from harness.scenario import Scenario
from harness.timeouts import Timeouts


@dataclass(frozen=True)
class ScenarioHistory:
    scenario: Scenario
    timeouts: Timeouts  # the bounds the world ran under, which the deadlines are judged by
    startup: tuple[StartupRecord | None, ...]  # None: the rank never finished capture
    steps: tuple[tuple[StepRecord | None, ...], ...]  # None: still running at the deadline
    evidence: str = ""  # stacks and last collectives of a hung, crashed or failed world
    # Ran in a batch, with no go-ahead between steps: a failure is confirmed by a run alone.
    batched: bool = False


def steps_may_run(startup: Sequence[StartupRecord | None]) -> bool:
    """Every rank captured without an error and left no thread or run behind. Graphs that
    recorded nothing, differ between ranks or cannot be reached still let the steps run:
    their consequences show there."""
    return all(r is not None and r.error is None and not r.threads_alive and not r.pending_run
               for r in startup)


def step_failed(records: Sequence[StepRecord | None]) -> bool:
    """After this step the world stops: a rank hung or failed, so its groups are suspect."""
    return any(r is None or r.error is not None for r in records)
