"""Verdicts a search knows without a world run: what a costly failure (a hang's deadline, a
relaunch of ranks that import vLLM) already told it.

- A run that stopped at a failed step stands for every scenario with the same config, faults
  and schedule and the same steps up to that one: a world runs no step after a failed one
  (harness/history/scenario_history.py `step_failed`), so the rest never matters. Hypothesis's
  mutations often redraw just those unrun steps.
- In a hunt for some failure classes, a faulted scenario whose run failed only outside them
  stands for every scenario with the same config and faults: the same fault is taken to fail
  the same way, a class the hunt does not count. Under vLLM's execution what a thread fault
  does follows from its stage, its microbatch, k and the overlap style, not the tokens
  (docs/spec.md §10.2); Hypothesis redraws the batches around a fault often, and each rerun of
  a hang costs its deadline and a relaunch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from harness.check.judge import ScenarioResult
from harness.fuzz.result import ExampleVerdict
from harness.history.scenario_history import step_failed
from harness.scenario import Scenario


def stopped_after(result: ScenarioResult) -> int | None:
    """How many steps ran when the last of them failed (the world ran no more), else None.
    A run that failed before any step is left out: its capture is not keyed here."""
    ran = len(result.steps)
    return ran if ran and step_failed(result.steps[-1].records) else None


def failed_outside_hunt(result: ScenarioResult, verdict: ExampleVerdict) -> bool:
    """A faulted run that failed, none of it in the hunt's classes (the verdict held)."""
    return bool(result.scenario.faults) and verdict.ok and not result.ok


def _key(scenario: Scenario, steps: int) -> str:
    """The scenario's config, faults and schedule, with its first `steps` steps."""
    data = scenario.to_dict()
    data["steps"] = data["steps"][:steps]
    return json.dumps(data, sort_keys=True)


@dataclass
class KnownVerdicts:
    _stopped: dict[str, ExampleVerdict] = field(default_factory=dict)
    _lengths: set[int] = field(default_factory=set)  # the steps each stopped run ran
    _outside: dict[str, ExampleVerdict] = field(default_factory=dict)  # by config and faults
    reused: int = 0  # verdicts handed out in place of a world run

    def add(self, scenario: Scenario, result: ScenarioResult, verdict: ExampleVerdict) -> None:
        ran = stopped_after(result)
        if ran is not None:
            self._stopped[_key(scenario, ran)] = verdict
            self._lengths.add(ran)
        if failed_outside_hunt(result, verdict):
            self._outside[_key(scenario, 0)] = verdict

    def forget(self, scenario: Scenario) -> None:
        """Keep nothing `scenario`'s runs left: its failure did not reproduce."""
        for ran in self._lengths:
            self._stopped.pop(_key(scenario, ran), None)
        self._outside.pop(_key(scenario, 0), None)

    def verdict_of(self, scenario: Scenario) -> ExampleVerdict | None:
        """The verdict a kept run stands for, if any."""
        known = self._outside.get(_key(scenario, 0))
        for ran in sorted(n for n in self._lengths if n <= len(scenario.steps)):
            known = known or self._stopped.get(_key(scenario, ran))
        self.reused += known is not None
        return known
