"""Which of the generator's fields a drawn scenario exercises: the reach table's classifiers.

A slip nobody planted is found only where the reference search draws an example that reaches
it, so each field the generator draws gets a yes/no classifier here. They judge under the
reference decision (docs/spec.md, harness/spec), never the system under test, like the aim.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from harness.batch import RankBatch, deciding_batch
from harness.config import CudaGraphMode, HarnessConfig, Mutation
from harness.dead_ranks import known_dead
from harness.gen.aim import reference_plans
from harness.history.decision import StepPlan
from harness.scenario import Scenario
from harness.spec.decision import dispatch, graph_table, last_region_start


@dataclass(frozen=True)
class Field:
    name: str
    meaning: str  # one line: what an example must hold to exercise the field
    exercised: Callable[[Scenario], bool]


def _steps(scenario: Scenario) -> list[tuple[list[RankBatch], list[StepPlan]]]:
    return [(scenario.batches(i), reference_plans(scenario.config, scenario.batches(i)))
            for i in range(len(scenario.steps))]


def twin_at_split(config: HarnessConfig, batches: Sequence[RankBatch]) -> int | None:
    """G of the twin some rank's k-way dispatch of the largest rank answers (§1.3 2a), before
    the guard looks at it; None when no rank has one. An idle rank brings a dummy decode."""
    k, q = config.num_ubatches, config.serving.decode_query_len
    reference = replace(config, mutation=Mutation())
    ucts = [b.uniform_token_count if b.num_tokens else q for b in batches]
    synced = ucts[0] if ucts[0] and all(u == ucts[0] for u in ucts) else None  # §1.2
    top = max(b.num_tokens for b in batches) or q
    table = graph_table(reference)
    for batch in batches:
        desc = dispatch(reference, table, batch.num_reqs or 1, top, synced, num_ubatches=k)
        if desc.cg_mode is not CudaGraphMode.NONE:
            return desc.num_tokens
    return None


def at_guard_edge(scenario: Scenario) -> bool:
    """A split step with a twin G whose smallest rank sits within one token of
    last_region_start(G, k): where the guard's `<=` decides between the twin and eager."""
    k = scenario.config.num_ubatches
    for batches, plans in _steps(scenario):
        if not plans[0].desc.microbatched:
            continue
        graph = twin_at_split(scenario.config, batches)
        smallest = min(b.num_tokens for b in batches)
        if graph is not None and abs(smallest - last_region_start(graph, k)) <= 1:
            return True
    return False


def replays_twin(scenario: Scenario) -> bool:
    """A step that replays a microbatched (twin) graph."""
    return any(plans[0].kind == "full-microbatched" for _, plans in _steps(scenario))


def has_drafts(scenario: Scenario) -> bool:
    """A config with draft tokens: decode_query_len > 1."""
    return scenario.config.serving.decode_query_len > 1


def at_draft_bound(scenario: Scenario) -> bool:
    """Varlen draft graphs and an unsplit padded step with a decode rank (or an idle one,
    whose dummy batch is a decode) beside a rank with a prefill: where the synced
    query-length bound decides the graph (§1.6, §7.17)."""
    serving = scenario.config.serving
    if serving.decode_query_len < 2 or not serving.varlen_decode:
        return False
    bounded = [d.num_tokens for d in graph_table(scenario.config)
               if d.max_query_len is not None]
    for batches, plans in _steps(scenario):
        state = plans[0].state
        if state is None or state.eager or plans[0].desc.microbatched:
            continue
        deciding = [deciding_batch(b, serving.decode_query_len) for b in batches]
        if not any(g >= max(b.num_tokens for b in deciding) for g in bounded):
            continue  # no varlen graph holds the step: the bound picks nothing
        bounds = [b.max_query_len for b in deciding]
        if None in bounds and any(bound is not None for bound in bounds):
            return True
    return False


def has_idle_rank(scenario: Scenario) -> bool:
    """A step where some rank has no tokens at all."""
    return any(b.num_tokens == 0 for ranks in scenario.steps for b in ranks)


def at_request_limit(scenario: Scenario) -> bool:
    """A rank's batch at max_num_reqs requests or at max_num_batched_tokens tokens."""
    serving = scenario.config.serving
    return any(b.num_reqs == serving.max_num_reqs
               or b.num_tokens == serving.max_num_batched_tokens
               for ranks in scenario.steps for b in ranks)


def crosses_region(batch: RankBatch, plan: StepPlan) -> bool:
    """One of this rank's requests starts before a region boundary and ends after it."""
    ends, edge = set(), 0
    for region in plan.regions[:-1]:
        edge += region.tokens
        ends.add(edge)
    start = 0
    for length in batch.request_query_lens():
        if any(start < edge < start + length for edge in ends):
            return True
        start += length
    return False


def straddles_region(scenario: Scenario) -> bool:
    """A split step in which some rank's request crosses a microbatch region boundary."""
    # An unsplit step's plan has no regions, so nothing crosses one there.
    return any(crosses_region(batch, plan) for batches, plans in _steps(scenario)
               for batch, plan in zip(batches, plans, strict=True))


def models_0_33(scenario: Scenario) -> bool:
    """A config modelling vLLM 0.33 (token-keyed graphs, no drafts with DBO)."""
    return not scenario.config.serving.release.request_keyed_decode


def drafts_split(scenario: Scenario) -> bool:
    """Draft tokens in a step that is split into microbatches (0.34, §1.6)."""
    return scenario.config.serving.decode_query_len > 1 and any(
        plans[0].desc.microbatched for _, plans in _steps(scenario))


def cut_between_requests(scenario: Scenario) -> bool:
    """A split step cut between uniform requests of more than one token (0.34, §4.1)."""
    return any(plans[0].desc.microbatched and (plans[0].uniform_token_count or 0) > 1
               for _, plans in _steps(scenario))


def has_draft_schedule(scenario: Scenario) -> bool:
    """Dynamic speculative decoding: a draft schedule of several query lengths (§1.6)."""
    return scenario.config.serving.draft_schedule is not None


def trims_drafts_in_split(scenario: Scenario) -> bool:
    """A rank whose drafts adaptive verification trimmed, in a split step (§7.24)."""
    return any(plans[0].desc.microbatched and any(b.scheduled_lens for b in batches)
               for batches, plans in _steps(scenario))


def loses_a_rank(scenario: Scenario) -> bool:
    """A DP rank dies and some survivor is told of it (§1.7)."""
    return any(known_dead(batches) for batches in scenario.steps)


def told_at_different_steps(scenario: Scenario) -> bool:
    """A step where one survivor has been told of a death and another has not (§7.25)."""
    return any(any(b.knows_dead != told for b in batches if not b.dead)
               for batches in scenario.steps if (told := tuple(sorted(known_dead(batches)))))


def has_fault(scenario: Scenario) -> bool:
    """A scenario carrying a fault (the nemesis)."""
    return bool(scenario.faults)


FIELDS: tuple[Field, ...] = (
    Field("guard edge", "split step, smallest rank within 1 of the twin's last region start",
          at_guard_edge),
    Field("twins", "a step replays a microbatched twin graph", replays_twin),
    Field("drafts", "decode_query_len > 1 (draft tokens)", has_drafts),
    Field("draft bound", "varlen drafts, decode or idle rank beside a prefill, padded step",
          at_draft_bound),
    Field("idle ranks", "some rank has 0 tokens in a step", has_idle_rank),
    Field("request limits", "a batch at max_num_reqs or max_num_batched_tokens",
          at_request_limit),
    Field("straddles", "a request crosses a region boundary of a split step",
          straddles_region),
    Field("faults", "the scenario carries a fault", has_fault),
    Field("release 0.33", "the config models vLLM 0.33", models_0_33),
    Field("drafts split", "decode_query_len > 1 in a microbatched step (0.34)", drafts_split),
    Field("request cut", "a split step cut between uniform requests of q > 1 tokens",
          cut_between_requests),
    Field("draft schedule", "several decode query lengths (dynamic drafts)", has_draft_schedule),
    Field("trimmed drafts", "a rank's drafts trimmed to a budget, in a split step",
          trims_drafts_in_split),
    Field("dead rank", "a DP rank dies and a survivor is told (fault tolerance)", loses_a_rank),
    Field("told apart", "survivors told of a death at different steps", told_at_different_steps),
)


def exercised_fields(scenario: Scenario) -> frozenset[str]:
    """The names of the fields `scenario` exercises."""
    return frozenset(f.name for f in FIELDS if f.exercised(scenario))
