"""The single-process reference each step is held to: rows, state and routes from the
plain model, and the plans each rank should have made: where another system decided, the
harness's own; where the harness decided, the plain oracle of docs/spec.md (spec_decision)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.check.spec_decision import spec_plans
from harness.config import DecisionSystem
from harness.history.decision import StepPlan
from harness.history.records import Route, Rows, rows_of
from harness.model.reference import reference_step
from harness.model.state import initial_state
from harness.model.weights import MoEWeights
from harness.scenario import Scenario
from harness.sut.step_plan import plan_without_world
from harness.sut.systems import base_config, plans_without_world, reference_config


@dataclass(frozen=True)
class ReferenceRows:
    """The single-process reference for one step: per rank, real rows, the state cache and
    the (source rank, token, expert) rows it must receive in the dispatch."""

    outputs: tuple[Rows, ...]
    states: tuple[Rows, ...]
    routes: tuple[tuple[Route, ...], ...]
    # Per rank, the harness's own plan when another system decided (None: the harness did).
    plans: tuple[StepPlan, ...] | None = None
    # Per rank, the plan docs/spec.md gives, when the harness decided (None: another system).
    spec_plans: tuple[StepPlan, ...] | None = None
    # Per rank, the unpatched vLLM's plan, when a patched one decided and that comparison
    # was asked for (`differential_against_base`).
    base_plans: tuple[StepPlan, ...] | None = None


def reference_rows(scenario: Scenario) -> list[ReferenceRows]:
    """The single-process reference of every step, each from the previous step's state."""
    config = scenario.config
    weights = MoEWeights.build(config)
    states = [initial_state(config, rank) for rank in range(config.dp_size)]
    judge_by = reference_config(config)  # another system's decisions are held to these
    base = base_config(config)
    rows = []
    for i, requests in enumerate(scenario.requests()):
        ref = reference_step(config, weights, requests, states)
        states = ref.states
        batches = scenario.batches(i)
        plans = None if judge_by is None else tuple(plan_without_world(judge_by, batches))
        # The harness's own decisions are held to a second statement of the spec that
        # shares no code with it (invariant 29 of docs/spec.md §8).
        expected = (tuple(spec_plans(config, batches))
                    if config.sut is DecisionSystem.HARNESS else None)
        rows.append(ReferenceRows(tuple(rows_of(t) for t in ref.outputs),
                                  tuple(rows_of(t) for t in ref.states),
                                  tuple(tuple(sorted(c.elements())) for c in ref.routes),
                                  plans, expected,
                                  None if base is None else tuple(
                                      plans_without_world(base, batches))))
    return rows
