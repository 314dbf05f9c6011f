"""The single-process reference each step is held to: rows, state and routes from the
plain model, and, where another system decided, the harness's own plans."""

from __future__ import annotations

from dataclasses import dataclass

from harness.history.decision import StepPlan
from harness.history.records import Route, Rows, rows_of
from harness.model.reference import reference_step
from harness.model.state import initial_state
from harness.model.weights import MoEWeights
from harness.scenario import Scenario
from harness.sut.step_plan import plan_without_world
from harness.sut.systems import reference_config


@dataclass(frozen=True)
class ReferenceRows:
    """The single-process reference for one step: per rank, real rows, the state cache and
    the (source rank, token, expert) rows it must receive in the dispatch."""

    outputs: tuple[Rows, ...]
    states: tuple[Rows, ...]
    routes: tuple[tuple[Route, ...], ...]
    # Per rank, the harness's own plan when another system decided (None: the harness did).
    plans: tuple[StepPlan, ...] | None = None


def reference_rows(scenario: Scenario) -> list[ReferenceRows]:
    """The single-process reference of every step, each from the previous step's state."""
    config = scenario.config
    weights = MoEWeights.build(config)
    states = [initial_state(config, rank) for rank in range(config.dp_size)]
    judge_by = reference_config(config)  # another system's decisions are held to these
    rows = []
    for i, requests in enumerate(scenario.requests()):
        ref = reference_step(config, weights, requests, states)
        states = ref.states
        plans = (None if judge_by is None
                 else tuple(plan_without_world(judge_by, scenario.batches(i))))
        rows.append(ReferenceRows(tuple(rows_of(t) for t in ref.outputs),
                                  tuple(rows_of(t) for t in ref.states),
                                  tuple(tuple(sorted(c.elements())) for c in ref.routes),
                                  plans))
    return rows
