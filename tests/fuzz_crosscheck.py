"""The fuzzer against the enumeration: on a fully pinned small config, every failure class
the exhaustive mode finds must also be found by a budgeted fuzz run hunting for it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.config import HarnessConfig
from harness.exhaustive import explore
from harness.fuzz.engine import Budget, fuzz
from harness.fuzz.variants import Variant
from harness.history.scenario_history import ScenarioHistory
from harness.scenario import Scenario

# The world checkers that show each class of the enumeration (a plan disagreement on the
# twins shows at capture, before any step runs).
SHOWN_BY = {"agreement": ("agreement", "capture_symmetry"),
            "no_empty_region": ("no_empty_region", "captured_split")}


@dataclass(frozen=True)
class CrossCheck:
    config: HarnessConfig
    enumerated: tuple[str, ...]  # classes the exhaustive mode found
    found: dict[str, str | None]  # class -> the checker the fuzzer caught it with (or None)

    @property
    def missed(self) -> tuple[str, ...]:
        return tuple(c for c in self.enumerated if self.found.get(c) is None)


def cross_check(config: HarnessConfig, run: Callable[[Scenario], ScenarioHistory], *,
                world: str, max_tokens: int, budget: Budget,
                seed: int | None = None) -> CrossCheck:
    enumerated = tuple(c.checker for c in explore(config, max_tokens).counterexamples)
    found: dict[str, str | None] = {}
    for cls in enumerated:
        hunted = SHOWN_BY.get(cls, (cls,))
        variant = Variant(f"cross-check-{cls}", f"hunting {cls} on a pinned config",
                          caught_by=hunted)
        outcome = fuzz(variant, run, world=world, dp_sizes=(config.serving.dp_size,),
                       fixed=config.to_dict(), budget=budget, seed=seed, hunt=hunted)
        found[cls] = outcome.checker if outcome.found else None
    return CrossCheck(config, enumerated, found)
