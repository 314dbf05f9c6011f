"""Exhaustive mode: every per-rank decode token vector of a small world, through the decision
layer and the structural checkers, with the smallest counterexample of each failure class.
It drives the decision code, so it lives outside the judge (harness/check imports no system
under test).

The decision of a step depends on each rank's own batch and the gathered matrix, so each
rank's column is computed once per token count; with a rank-symmetric config a vector and
its permutations decide the same, so only sorted vectors are visited.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from harness.batch import RankBatch
from harness.check.agreement import first_disagreement
from harness.config import DecisionSystem, HarnessConfig
from harness.errors import ConfigError
from harness.history.decision import StepPlan
from harness.sut.dp_sync import decide_from_matrix, gather_columns, local_column
from harness.sut.step_plan import graph_table_for, plan_step
from harness.sut.systems import plans_without_world


@dataclass(frozen=True)
class Counterexample:
    checker: str
    tokens: tuple[int, ...]
    detail: str


@dataclass(frozen=True)
class ExhaustiveResult:
    config: HarnessConfig
    max_tokens: int
    vectors: int
    counterexamples: tuple[Counterexample, ...]  # the first (smallest) one of each class

    @property
    def ok(self) -> bool:
        return not self.counterexamples


def token_vectors(config: HarnessConfig, max_tokens: int) -> Iterator[tuple[int, ...]]:
    counts = range(max_tokens + 1)
    if config.mutation.threshold_offset_rank is None:
        return itertools.combinations_with_replacement(counts, config.serving.dp_size)
    return itertools.product(counts, repeat=config.serving.dp_size)


def structural_failures(plans: list[StepPlan]) -> list[tuple[str, str]]:
    """What the checkers that need no execution say about one step's plans."""
    failures = []
    disagreement = first_disagreement(plans)
    if disagreement is not None:
        failures.append(("agreement", disagreement.describe()))
    for plan in plans:
        empty = list(plan.empty_regions())
        if empty:
            failures.append(("no_empty_region", f"rank {plan.rank} replays "
                             f"{plan.desc.label()} with empty region(s) {empty}"))
            break
    return failures


def explore(config: HarnessConfig, max_tokens: int) -> ExhaustiveResult:
    """Every uniform-decode step of up to `max_tokens` tokens per rank; idle ranks included.
    A bound no legal decode batch reaches is a ConfigError, never quietly lowered."""
    # A decode batch of n tokens holds n requests: beyond either cap no scheduler makes one.
    largest = min(config.serving.max_num_reqs, config.serving.max_num_batched_tokens)
    if not 0 <= max_tokens <= largest:
        raise ConfigError("max_tokens", f"is {max_tokens}; the enumeration honours 0 to "
                          f"{largest}: a decode batch of n tokens has n requests, so n is at "
                          f"most max_num_reqs={config.serving.max_num_reqs} and "
                          f"max_num_batched_tokens={config.serving.max_num_batched_tokens}")
    limit = max_tokens
    if config.system.sut is not DecisionSystem.HARNESS:
        return _explore_other_system(config, limit)
    tables = [graph_table_for(config, rank) for rank in range(config.serving.dp_size)]
    batches = [RankBatch.uniform(n, 1) for n in range(limit + 1)]
    columns = [[local_column(t, b) for b in batches] for t in tables]
    found: dict[str, Counterexample] = {}
    vectors = 0
    for tokens in token_vectors(config, limit):
        vectors += 1
        rows = gather_columns([columns[r][n] for r, n in enumerate(tokens)])
        plans = [plan_step(config, rank, batches[n],
                           decide_from_matrix(config, tables[rank], rows, batches[n]))
                 for rank, n in enumerate(tokens)]
        for checker, detail in structural_failures(plans):
            found.setdefault(checker, Counterexample(checker, tuple(tokens), detail))
    return ExhaustiveResult(config, limit, vectors, tuple(found.values()))


def _explore_other_system(config: HarnessConfig, limit: int) -> ExhaustiveResult:
    """The same enumeration with another system's code deciding (vLLM's, through its own
    DP sync with the all-reduce's result handed in): slower, one sync per rank per vector."""
    batches = [RankBatch.uniform(n, 1) for n in range(limit + 1)]
    found: dict[str, Counterexample] = {}
    vectors = 0
    for tokens in token_vectors(config, limit):
        vectors += 1
        plans = plans_without_world(config, [batches[n] for n in tokens])
        for checker, detail in structural_failures(plans):
            found.setdefault(checker, Counterexample(checker, tuple(tokens), detail))
    return ExhaustiveResult(config, limit, vectors, tuple(found.values()))
