"""How often a property test reaches its assertions. A property asserted under a branch that
few drawn examples enter is green for want of trying, so each property's body returns whether
it reached its asserting branch, and `reach_share` counts that over the examples Hypothesis
draws for it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

MIN_SHARE = 0.2  # every property reaches its assertions in at least a fifth of its examples


def reach_share(strategy: st.SearchStrategy, body: Callable[[Any], bool], *,
                examples: int = 100, at_seed: int = 0) -> float:
    """The share of the examples Hypothesis generates from `strategy` (at `at_seed`, no
    database) on which `body` says it reached its asserting branch; its assertions run too."""
    reached: list[bool] = []

    @seed(at_seed)
    @settings(max_examples=examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(value: Any) -> None:
        reached.append(bool(body(value)))

    run()
    return sum(reached) / len(reached)
