"""Distinct examples drawn from a strategy through Hypothesis's public API, with no world: the
draws the bench's decision-only tables (reach, staging) count over."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, Verbosity, given, settings, target
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

T = TypeVar("T")


class _Drawn(BaseException):  # a control-flow signal, not an error
    """Enough examples drawn: unwinds out of Hypothesis as the fuzzer's budget signal does."""


def distinct_draws(strategy: st.SearchStrategy[T], count: int, seed: int, *,
                   max_examples: int, key: Callable[[T], Hashable] = lambda value: value,
                   steer: Callable[[T], dict[str, float]] | None = None,
                   profile: str | None = None) -> list[T]:
    """Up to `count` draws distinct by `key` (fewer if Hypothesis runs out first), in order.
    `steer` gives target() values per draw (then Hypothesis's target phase runs too);
    `profile` names the settings profile the draws start from (default: the current one)."""
    seen: dict[Hashable, T] = {}
    parent: Any = settings.get_profile(profile) if profile else None
    phases = [Phase.generate, Phase.target] if steer else [Phase.generate]

    @hypothesis_seed(seed)
    @settings(parent, max_examples=max_examples, database=None, deadline=None, phases=phases,
              verbosity=Verbosity.quiet, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def draw(data: st.DataObject) -> None:
        value = data.draw(strategy, label="example")
        for label, score in (steer(value) if steer else {}).items():
            target(score, label=label)
        seen.setdefault(key(value), value)
        if len(seen) >= count:
            raise _Drawn()

    try:
        draw()
    except _Drawn:
        pass
    return list(seen.values())
