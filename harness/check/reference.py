"""The single-process reference each step is held to: rows, state and routes from the
plain model, and the plans each rank should have made: where the harness decided, the plain
oracle of docs/spec.md (spec_decision); where another system decided, the plans it is compared
with, computed outside the judge (harness/reference_plans.py) and handed in, since the judge
imports no system under test."""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from harness.config import DecisionSystem, HarnessConfig
from harness.dead_ranks import dead_at, known_dead
from harness.history.decision import StepPlan
from harness.history.records import Route, Rows, rows_of
from harness.model.reference import reference_step
from harness.model.state import RequestSpec, initial_state
from harness.model.weights import MoEWeights
from harness.scenario import Scenario
from harness.spec.decision import spec_plans


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
    # Per rank, the step's input: its requests' query lengths, in batch order.
    query_lens: tuple[tuple[int, ...], ...] = ()
    # Under fault tolerance (§1.7): the ranks dead at this step, those some live rank was told
    # of, and where one is told of, per rank the spec's plan with every dead column kept.
    dead: tuple[int, ...] = ()
    known_dead: tuple[int, ...] = ()
    plans_keeping_dead: tuple[StepPlan, ...] | None = None

    @property
    def plans_over_live_columns(self) -> tuple[StepPlan, ...] | None:
        """The plans a rank that leaves every known dead column out makes."""
        return self.plans if self.plans is not None else self.spec_plans


@dataclass(frozen=True)
class PlansToMatch:
    """One step's plans another system is compared with, per rank (None: not compared)."""

    plans: tuple[StepPlan, ...] | None = None  # the harness's own decision code's
    base_plans: tuple[StepPlan, ...] | None = None  # the unpatched vLLM's


def needs_plans_to_match(config: HarnessConfig) -> bool:
    """Whether another system decided, or a base vLLM was asked for: the judge cannot make
    those plans itself."""
    return (config.system.sut is not DecisionSystem.HARNESS
            or config.system.differential_against_base)


def reference_rows(scenario: Scenario,
                   to_match: Sequence[PlansToMatch] | None = None) -> list[ReferenceRows]:
    """The single-process reference of every step, each from the previous step's state;
    `to_match` (one per step) is required where another system decided."""
    config = scenario.config
    if to_match is None and needs_plans_to_match(config):
        raise ValueError("another system decided: the plans it is compared with come from "
                         "harness.reference_plans.references_for, not from the judge")
    to_match = [PlansToMatch()] * len(scenario.steps) if to_match is None else to_match
    if len(to_match) != len(scenario.steps):
        raise ValueError(f"{len(to_match)} steps of plans to match for {len(scenario.steps)}")
    requests = functools.cache(scenario.requests)  # built only when a rank's rows are
    rows = []
    for i, matched in enumerate(to_match):
        ranks = [_rank_reference(config, rank, tuple(step[rank].query_lens
                                                     for step in scenario.steps[:i + 1]),
                                 requests)
                 for rank in range(config.serving.dp_size)]
        batches = scenario.batches(i)
        # The harness's own decisions are held to a second statement of the spec that
        # shares no code with it (invariant 29 of docs/spec.md §8).
        expected = (tuple(spec_plans(config, batches))
                    if config.system.sut is DecisionSystem.HARNESS else None)
        told = known_dead(batches)
        keeping = (tuple(spec_plans(config, [b.with_deaths((), b.dead) for b in batches]))
                   if told else None)
        rows.append(ReferenceRows(tuple(r.outputs for r in ranks),
                                  tuple(r.state for r in ranks),
                                  tuple(tuple(sorted(route for r in ranks
                                                     for route in r.routes[dest]))
                                        for dest in range(config.serving.dp_size)),
                                  matched.plans, expected, matched.base_plans,
                                  tuple(b.request_query_lens() for b in batches),
                                  tuple(sorted(dead_at(batches))), tuple(sorted(told)),
                                  keeping))
    return rows


@dataclass(frozen=True)
class _RankReference:
    """One rank's reference after a run of steps: its rows, its state (as rows and as the
    tensor the next step starts from) and, per destination rank, the routes it sends."""

    outputs: Rows
    state: Rows
    state_tensor: torch.Tensor
    routes: tuple[tuple[Route, ...], ...]


# The plain model computes a rank's rows from that rank's requests and state alone
# (`reference_step` runs rank by rank), and a rank's requests follow from the config, the
# rank and its query lengths so far (`Scenario.requests`): a rank's history seen before is
# not computed again. Bounded, least recently used out first.
_MEMO: OrderedDict[tuple, _RankReference] = OrderedDict()
MEMO_SIZE = 4096


def _rank_reference(config: HarnessConfig, rank: int, lens: tuple[tuple[int, ...], ...],
                    requests: Callable[[], list[list[list[RequestSpec]]]]) -> _RankReference:
    """Rank `rank`'s reference after the steps whose query lengths `lens` lists: the plain
    model over this rank's requests alone, every other rank idle."""
    key = (config, rank, lens)
    if key in _MEMO:
        _MEMO.move_to_end(key)
        return _MEMO[key]
    step = len(lens) - 1
    state = (_rank_reference(config, rank, lens[:-1], requests).state_tensor if step
             else initial_state(config, rank))
    batches: list[list[RequestSpec]] = [[] for _ in range(config.serving.dp_size)]
    batches[rank] = requests()[step][rank]
    states = [state] * config.serving.dp_size  # reference_step clones each; idle ranks change none
    ref = reference_step(config, _weights(config), batches, states)
    _MEMO[key] = found = _RankReference(
        rows_of(ref.outputs[rank]), rows_of(ref.states[rank]), ref.states[rank],
        tuple(tuple(ref.routes[dest].elements()) for dest in range(config.serving.dp_size)))
    if len(_MEMO) > MEMO_SIZE:
        _MEMO.popitem(last=False)
    return found


@functools.lru_cache(maxsize=16)
def _weights(config: HarnessConfig) -> MoEWeights:
    return MoEWeights.build(config)
