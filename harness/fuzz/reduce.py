"""A last shrink pass over what Hypothesis shrinks poorly: the number of ranks and of steps,
and token counts drawn from boundary lists.

Hypothesis shrinks the choices it made; dropping a rank shifts every later draw, so a failure
found on four ranks often stays on four, and a count drawn from a list of boundaries moves
only to another boundary. Here each candidate one notch simpler (one step alone, one rank
fewer, then one token fewer on a rank) is tried, greedily, while the failure still reproduces;
a failure then sits on the lower edge of the counts that show it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator

from harness.errors import ConfigError
from harness.scenario import Scenario

MIN_RANKS = 2  # a DP world


def simpler_scenarios(scenario: Scenario, dp_sizes: Collection[int]) -> Iterator[Scenario]:
    """One notch simpler; a rank fewer only where the search draws that DP size (a torchrun
    world has one width)."""
    if len(scenario.steps) > 1:
        for step in range(len(scenario.steps)):
            yield scenario.only_step(step)
    fewer = scenario.config.serving.dp_size - 1
    if fewer >= MIN_RANKS and fewer in dp_sizes:
        for rank in reversed(range(scenario.config.serving.dp_size)):
            try:
                yield scenario.without_rank(rank)
            except ConfigError:
                continue  # e.g. fewer ranks than top_k experts need


def fewer_tokens(scenario: Scenario) -> Iterator[Scenario]:
    """One token fewer on one rank of one step, heaviest ranks first."""
    for step, ranks in enumerate(scenario.steps):
        order = sorted(range(len(ranks)), key=lambda r: -sum(ranks[r].query_lens))
        for rank in order:
            candidate = scenario.one_token_fewer(step, rank)
            if candidate is not None:
                yield candidate


def reduce_scenario(scenario: Scenario, still_fails: Callable[[Scenario], bool],
                    dp_sizes: Collection[int], token_seconds: float = 10.0) -> Scenario:
    """The simplest scenario reachable by single simplifications that still fails. The token
    pass (one world run per candidate) stops after `token_seconds`, keeping what it reached."""
    scenario = reduce_structure(scenario, still_fails, dp_sizes)
    return reduce_tokens(scenario, still_fails, time.monotonic() + token_seconds)


def reduce_structure(scenario: Scenario, still_fails: Callable[[Scenario], bool],
                     dp_sizes: Collection[int]) -> Scenario:
    """Fewer steps and ranks while it still fails: a few candidates, unbounded."""
    return _greedy(scenario, still_fails, lambda s: simpler_scenarios(s, dp_sizes))


def reduce_tokens(scenario: Scenario, still_fails: Callable[[Scenario], bool],
                  deadline: float | None = None) -> Scenario:
    """Fewer tokens while it still fails; bounded by `deadline` or by `still_fails` itself
    (the fuzzer's answers no once its shrink bounds are spent)."""
    return _greedy(scenario, still_fails, fewer_tokens, deadline)


def _greedy(scenario: Scenario, still_fails: Callable[[Scenario], bool],
            candidates: Callable[[Scenario], Iterator[Scenario]],
            deadline: float | None = None) -> Scenario:
    progress = True
    while progress:
        progress = False
        for candidate in candidates(scenario):
            if deadline is not None and time.monotonic() > deadline:
                return scenario
            if still_fails(candidate):
                scenario, progress = candidate, True
                break
    return scenario
