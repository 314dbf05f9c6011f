"""A last shrink pass over what Hypothesis shrinks poorly: the number of ranks and of steps.

Hypothesis shrinks the choices it made; dropping a rank shifts every later draw, so a failure
found on four ranks often stays on four. Here each candidate one notch simpler (one step
alone, one rank fewer) is tried, greedily, while the failure still reproduces.
"""

from __future__ import annotations

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
    fewer = scenario.config.dp_size - 1
    if fewer >= MIN_RANKS and fewer in dp_sizes:
        for rank in reversed(range(scenario.config.dp_size)):
            try:
                yield scenario.without_rank(rank)
            except ConfigError:
                continue  # e.g. fewer ranks than top_k experts need


def reduce_scenario(scenario: Scenario, still_fails: Callable[[Scenario], bool],
                    dp_sizes: Collection[int]) -> Scenario:
    """The simplest scenario reachable by single simplifications that still fails."""
    progress = True
    while progress:
        progress = False
        for candidate in simpler_scenarios(scenario, dp_sizes):
            if still_fails(candidate):
                scenario, progress = candidate, True
                break
    return scenario
