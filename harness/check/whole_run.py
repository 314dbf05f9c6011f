"""Checkers of the scenario phase: properties of the whole run, over every step's records at
once, that no single step's checker can see (a step missing from a history is judged by no
step checker at all)."""

from __future__ import annotations

from collections.abc import Sequence

from harness.check.verdict import Judgement, failed, held, not_applicable
from harness.history.records import StartupRecord, StepRecord
from harness.history.scenario_history import step_failed, steps_may_run


def check_steps_complete(planned: int, startup: Sequence[StartupRecord | None],
                         steps: Sequence[Sequence[StepRecord | None]]) -> Judgement:
    """Every planned step ran on every rank, each record in its place (rank r's record of
    step i), or the run stopped right after the first step that failed."""
    if not steps and not steps_may_run(startup):
        return not_applicable("capture failed: no step could run")
    for i, records in enumerate(steps):
        for slot, rec in enumerate(records):
            if rec is not None and (rec.step, rec.rank) != (i, slot):
                return failed(f"step {i}, rank {slot}: holds rank {rec.rank}'s record of "
                              f"step {rec.step}")
        if step_failed(records) and i != len(steps) - 1:
            return failed(f"step {i} failed, yet {len(steps) - 1 - i} more step(s) ran after "
                          "it on the groups it left suspect")
    if len(steps) > planned:
        return failed(f"{len(steps)} steps ran; the scenario has {planned}")
    if len(steps) < planned and not (steps and step_failed(steps[-1])):
        return failed(f"only {len(steps)} of the scenario's {planned} steps ran, and none "
                      "failed: steps no checker judged")
    if len(steps) < planned:
        return held(f"stopped after step {len(steps) - 1} of {planned}, which failed")
    return held(f"all {planned} steps on every rank")
