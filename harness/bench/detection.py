"""Time and examples to detection of every planted bug, from an empty example database and
fresh random seeds: the fuzzer's speed where it matters (part of `make bench`)."""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from harness.fuzz.engine import FUZZ_TIMEOUTS, SIM_DP_SIZES, Budget, fuzz
from harness.fuzz.variants import VARIANTS
from harness.world.pool import WorldPool

GOAL_S = 30.0


@dataclass(frozen=True)
class DetectionRow:
    world: str
    variant: str
    seconds: tuple[float | None, ...]  # per seed; None: not found within the budget
    examples: tuple[int | None, ...]

    @property
    def found(self) -> int:
        return sum(s is not None for s in self.seconds)

    def median_s(self) -> float | None:
        found = [s for s in self.seconds if s is not None]
        return statistics.median(found) if found else None

    def worst_s(self) -> float | None:
        return None if self.found < len(self.seconds) else max(self.seconds)


def detection_rows(world: str, seeds: list[int], budget_s: float,
                   names: tuple[str, ...] | None = None) -> list[DetectionRow]:
    """Rows for every planted bug, or for those `names` only."""
    nproc = None if world == "sim" else 2
    dp_sizes = SIM_DP_SIZES if nproc is None else (nproc,)
    rows = []
    with WorldPool(world, "gloo", FUZZ_TIMEOUTS, nproc) as pool:
        for name, variant in VARIANTS.items():
            if variant.is_reference or (names is not None and name not in names):
                continue
            seconds, examples = [], []
            for seed in seeds:
                # Detection only: no shrinking, so every seed costs at most the budget.
                outcome = fuzz(variant, pool.run, world=world, dp_sizes=dp_sizes,
                               budget=Budget(seconds=budget_s, shrink_seconds=0.0),
                               database=None, seed=seed, scenario_dir=_scratch())
                seconds.append(outcome.seconds_to_detection)
                examples.append(outcome.examples_to_detection)
            rows.append(DetectionRow(world, name, tuple(seconds), tuple(examples)))
    return rows


def _scratch() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="dbo-bench-found-")


def random_seeds(count: int) -> list[int]:
    return [random.randrange(2**32) for _ in range(count)]


def print_detection(rows: list[DetectionRow]) -> None:
    width = max([len("variant"), *(len(row.variant) for row in rows)])
    print(f"\n{'world':9} {'variant':{width}} {'found':>6} {'median s':>9} {'worst s':>8} "
          f"{'examples (per seed)':24} goal <{GOAL_S:.0f}s")
    for row in rows:
        median, worst = row.median_s(), row.worst_s()
        per_seed = ", ".join("-" if e is None else str(e) for e in row.examples)
        met = "yes" if worst is not None and worst < GOAL_S else "NO"
        print(f"{row.world:9} {row.variant:{width}} {row.found:>3}/{len(row.seconds):<2} "
              f"{_fmt(median):>9} {_fmt(worst):>8} {per_seed:24} {met}")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
