"""The judge: a world's history of one scenario through every checker, once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.check.reference import ReferenceRows, reference_rows
from harness.check.registry import check_scenario, check_startup, check_step
from harness.check.verdict import Verdict
from harness.history.records import StartupRecord, StepRecord
from harness.history.scenario_history import ScenarioHistory
from harness.scenario import Scenario


@dataclass(frozen=True)
class StepResult:
    records: tuple[StepRecord | None, ...]  # None: the rank was still running at the deadline
    verdicts: tuple[Verdict, ...]

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)


@dataclass(frozen=True)
class ScenarioResult:
    scenario: Scenario
    startup: tuple[StartupRecord | None, ...]
    startup_verdicts: tuple[Verdict, ...]
    steps: tuple[StepResult, ...]
    evidence: str = ""  # stacks and last collectives of a hung or crashed world
    scenario_verdicts: tuple[Verdict, ...] = ()  # once over the whole run (Phase.SCENARIO)

    @property
    def ok(self) -> bool:
        return (all(v.ok for v in self.startup_verdicts) and all(s.ok for s in self.steps)
                and all(v.ok for v in self.scenario_verdicts))

    def verdicts(self) -> list[Verdict]:
        return [*self.startup_verdicts, *(v for step in self.steps for v in step.verdicts),
                *self.scenario_verdicts]

    def failed_verdicts(self) -> list[tuple[int | None, Verdict]]:
        """(step, verdict) per failed verdict; step None: a start-up or scenario verdict."""
        out = [(None, v) for v in self.startup_verdicts if not v.ok]
        for i, step in enumerate(self.steps):
            out += [(i, v) for v in step.verdicts if not v.ok]
        return out + [(None, v) for v in self.scenario_verdicts if not v.ok]


def judge(history: ScenarioHistory,
          references: Sequence[ReferenceRows] | None = None) -> ScenarioResult:
    """Every checker over `history`; against `references` when given (a saved run's, or
    harness/reference_plans.py's), else the single-process reference computed from its
    scenario, which the judge makes alone only where the harness decided."""
    references = reference_rows(history.scenario) if references is None else references
    deadlines = history.timeouts
    startup_verdicts = tuple(check_startup(history.startup, deadlines.startup_deadline_s,
                                           history.scenario.config))
    results = tuple(StepResult(records, tuple(check_step(records, references[i],
                                                          deadlines.step_deadline_s,
                                                          history.evidence)))
                    for i, records in enumerate(history.steps))
    whole = tuple(check_scenario(len(history.scenario.steps), history.startup, history.steps))
    return ScenarioResult(history.scenario, history.startup, startup_verdicts, results,
                          history.evidence, whole)
