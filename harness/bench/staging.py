"""The staging table of `make bench`: on each of the fuzzer's DP skew shapes, how many split
steps keep their FULL microbatched replay under the fixed guard (eager fallback) and under
real-token staging (the `staging` policy, docs/spec.md §3.4).

Decisions only, no world: configs and batches drawn the way the fuzzer draws them (its config
space, one skew shape per row, its layouts), each step decided both ways by the
harness's decision code. Draft tokens are left out: they exist only with microbatching off,
where no step splits.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import strategies as st

from harness.batch import RankBatch
from harness.bench.draws import distinct_draws
from harness.config import HarnessConfig
from harness.fuzz.engine import SIM_DP_SIZES
from harness.gen.strategies import (
    SKEW_SHAPES,
    fuzz_configs,
    laid_out,
    rank_batch,
    skewed_token_counts,
)
from harness.sut.step_plan import plan_without_world

SHAPES = tuple(dict.fromkeys(SKEW_SHAPES))
DRAWS = 300  # distinct steps per shape

Step = tuple[HarnessConfig, tuple[RankBatch, ...]]


@dataclass(frozen=True)
class StagingRow:
    shape: str
    steps: int  # distinct steps drawn
    split: int  # of them, split k ways (the same under both guards)
    full_fixed: int  # split steps replaying their twin under the fixed guard
    full_staged: int  # and under staging

    @property
    def rescued(self) -> int:
        return self.full_staged - self.full_fixed


@st.composite
def _step(draw, shape: str) -> Step:
    """One step as the fuzzer lays it out: every rank decodes, or each rank on its own."""
    config = draw(fuzz_configs({}, dp_sizes=SIM_DP_SIZES))
    counts = draw(skewed_token_counts(config, (shape,)))
    limit = min(config.serving.max_num_reqs, config.serving.max_num_batched_tokens)
    if draw(st.booleans()) and max(counts) <= limit:
        return config, tuple(laid_out(config, n, n) for n in counts)
    return config, tuple(draw(rank_batch(config, n)) for n in counts)


def drawn_steps(shape: str, count: int, seed: int) -> list[Step]:
    """`count` distinct steps of one skew shape (fewer if Hypothesis runs out first)."""
    return distinct_draws(_step(shape), count, seed, max_examples=20 * count)


def staging_row(shape: str, steps: Sequence[Step]) -> StagingRow:
    split = full_fixed = full_staged = 0
    for config, batches in steps:
        fixed = plan_without_world(config, batches)[0]
        staged = plan_without_world(config.with_changes(staging=True), batches)[0]
        if fixed.desc.microbatched != staged.desc.microbatched:
            raise AssertionError(f"staging changed whether {batches} splits under {config}")
        split += fixed.desc.microbatched
        full_fixed += fixed.kind == "full-microbatched"
        full_staged += staged.kind == "full-microbatched"
    return StagingRow(shape, len(steps), split, full_fixed, full_staged)


def staging_rows(draws: int = DRAWS, seed: int = 0) -> list[StagingRow]:
    rows = [staging_row(shape, drawn_steps(shape, draws, seed + i))
            for i, shape in enumerate(SHAPES)]
    total = StagingRow("all", *(sum(getattr(r, f) for r in rows)
                                for f in ("steps", "split", "full_fixed", "full_staged")))
    return [*rows, total]


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else f"{'-':>6}"


def print_staging(rows: Sequence[StagingRow], seed: int) -> None:
    print(f"\nreal-token staging (docs/spec.md §3.4): split steps that keep their FULL "
          f"microbatched replay, fixed guard (eager fallback) vs staged; seed {seed}")
    print(f"{'shape':10} {'steps':>6} {'split':>6} {'FULL fixed':>11} {'FULL staged':>12} "
          f"{'rescued':>8} {'kept fixed':>11} {'kept staged':>12}")
    for row in rows:
        print(f"{row.shape:10} {row.steps:>6} {row.split:>6} {row.full_fixed:>11} "
              f"{row.full_staged:>12} {row.rescued:>8} {_share(row.full_fixed, row.split):>11} "
              f"{_share(row.full_staged, row.split):>12}")
    print("steps: distinct steps drawn as the fuzzer draws them (its configs, that skew shape, "
          "its layouts); split: split k ways (under both guards alike); FULL: of those, "
          "replaying the twin; rescued: split steps the fixed guard sends to eager that "
          "staging replays; kept: FULL / split")


def print_staging_table(draws: int = DRAWS, seed: int | None = None) -> None:
    seed = random.randrange(2**32) if seed is None else seed
    print_staging(staging_rows(draws, seed), seed)
