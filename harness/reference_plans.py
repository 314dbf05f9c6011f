"""The plans another system's decisions are compared with, made here and handed to the judge:
the harness's own decision code under the same config, and the unpatched vLLM when a patched
one is held against it. The judge (harness/check) imports no system under test, so a saved
run is judged again from its records and these plans alone."""

from __future__ import annotations

import traceback

from harness.check.judge import ScenarioResult, judge
from harness.check.reference import (
    PlansToMatch,
    ReferenceRows,
    needs_plans_to_match,
    reference_rows,
)
from harness.errors import cannot_of
from harness.history.scenario_history import ScenarioHistory
from harness.scenario import Scenario
from harness.sut.step_plan import plan_without_world
from harness.sut.systems import base_config, plans_without_world, reference_config


def plans_to_match(scenario: Scenario) -> list[PlansToMatch]:
    """Per step, the plans another system is held to (both None where the harness decided
    and no base vLLM was asked for)."""
    config = scenario.config
    judge_by, base = reference_config(config), base_config(config)
    found = []
    for i in range(len(scenario.steps)):
        batches = scenario.batches(i)
        found.append(PlansToMatch(
            None if judge_by is None else tuple(plan_without_world(judge_by, batches)),
            None if base is None else tuple(plans_without_world(base, batches))))
    return found


def references_for(scenario: Scenario) -> list[ReferenceRows]:
    """The whole reference of every step, whichever system decided. One that raises is the
    harness's failure (HarnessCannot, exit 3), never a finding of the run it judges."""
    try:
        to_match = plans_to_match(scenario) if needs_plans_to_match(scenario.config) else None
        return reference_rows(scenario, to_match)
    except Exception as exc:  # any error here is the harness's own, not the run's
        raise cannot_of(exc, "reference", "computing the expected rows and plans raised",
                        traceback.format_exc()) from exc


def judge_run(history: ScenarioHistory) -> ScenarioResult:
    """Every checker over `history`, against the whole reference of its scenario."""
    return judge(history, references_for(history.scenario))
