"""The reach table of `make bench`: how often the reference search's examples exercise each
field the generator draws, and how long the search on the sim world takes to its first one.

A slip nobody planted is found only by the reference search, and only once it draws an
example reaching the slip; this table says which fields it reaches too rarely (harness/gen/
reach.py says what reaching each one means). Shares come from examples drawn without a
world; the first-example columns from the real reference fuzz on the sim world.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

from harness.bench.draws import distinct_draws
from harness.fuzz.engine import FUZZ_TIMEOUTS, SIM_DP_SIZES, Budget, fuzz, scenario_strategy
from harness.fuzz.variants import VARIANTS
from harness.gen.aim import steering
from harness.gen.reach import FIELDS, Field
from harness.history.scenario_history import ScenarioHistory
from harness.scenario import Scenario
from harness.world.pool import WorldPool

GOAL_S = 30.0  # a slip in a field should be reached within this, expected
# World-free draws behind the share column: per seed about what a 30 s reference fuzz runs on
# the sim world, so that they hold the same mix of Hypothesis's generate and target phases.
DRAWS_PER_SEED = 250
DRAW_SEEDS = 4


@dataclass(frozen=True)
class Arrival:
    """One example the fuzz ran: seconds from the search's start to the end of its run."""

    seconds: float
    scenario: Scenario


@dataclass(frozen=True)
class ReachRow:
    field: str
    meaning: str
    drawn: int  # examples drawn without a world
    drawn_hits: int  # of them, those exercising the field
    run_hits: int  # fuzz examples exercising it
    first_s: float | None  # seconds to the first fuzz example exercising it; None: never
    first_example: int | None  # its 1-based place among the fuzz examples
    seconds_per_example: float | None  # of the fuzz run
    seeds: int = 0  # seeds of the draws, DRAWS_PER_SEED examples each: one 30 s search apiece
    seeds_reaching: int = 0  # of them, those with an example exercising the field

    @property
    def share(self) -> float:
        return self.drawn_hits / self.drawn if self.drawn else 0.0

    def expected_s(self) -> float | None:
        """Expected seconds to a first example: seconds per example / share; None: never."""
        if not self.share or self.seconds_per_example is None:
            return None
        return self.seconds_per_example / self.share

    def meets_goal(self) -> bool:
        """Expected within GOAL_S, and reached by every seed: hits come in clusters (the
        search mutates around one), so a fair share can still leave whole searches without."""
        expected = self.expected_s()
        return (expected is not None and expected <= GOAL_S
                and self.seeds_reaching == self.seeds)


def _key(scenario: Scenario) -> str:
    return json.dumps(scenario.to_dict(), sort_keys=True)


def drawn_examples(count: int, seed: int) -> list[Scenario]:
    """`count` distinct reference examples drawn as the fuzzer draws them: its strategy,
    steered by the same targets, under the fuzzer's example bound (Hypothesis schedules its
    target phase by it), stopped once enough are drawn; no world, Hypothesis's public API."""
    strategy = scenario_strategy(VARIANTS["reference"], {}, SIM_DP_SIZES)
    return distinct_draws(strategy, count, seed, max_examples=Budget().max_examples, key=_key,
                          steer=steering, profile="dev")


def fuzzed_examples(seconds: float, seed: int) -> tuple[list[Arrival], str]:
    """The examples a reference fuzz of `seconds` on the sim world runs, in order, each with
    when its run ended; and a note when the search ended on a failure instead."""
    arrivals: list[Arrival] = []
    seen: set[str] = set()
    with WorldPool("sim", "gloo", FUZZ_TIMEOUTS) as pool:
        start = time.monotonic()

        def recorded(scenario: Scenario) -> ScenarioHistory:
            history = pool.run(scenario)
            if _key(scenario) not in seen:  # a failure's rerun is the same example
                seen.add(_key(scenario))
                arrivals.append(Arrival(time.monotonic() - start, scenario))
            return history

        outcome = fuzz(VARIANTS["reference"], recorded, world="sim", dp_sizes=SIM_DP_SIZES,
                       budget=Budget(seconds=seconds, shrink_seconds=0.0), database=None,
                       seed=seed, scenario_dir=tempfile.mkdtemp(prefix="dbo-bench-reach-"))
    if not outcome.found:
        return arrivals, ""
    # Shrinking's candidates are no draws: keep the search's examples up to the failure.
    kept = arrivals[:outcome.examples_to_detection]
    return kept, f"the reference search failed ({outcome.checker}: {outcome.detail[:120]})"


def reach_rows(drawn: Sequence[Sequence[Scenario]], arrivals: Sequence[Arrival],
               fields: Sequence[Field] = FIELDS) -> list[ReachRow]:
    """One row per field from the world-free draws (one group per seed) and the fuzz run's
    examples."""
    per_example = arrivals[-1].seconds / len(arrivals) if arrivals else None
    rows = []
    for f in fields:
        per_seed = [sum(f.exercised(s) for s in group) for group in drawn]
        hits = [i for i, a in enumerate(arrivals) if f.exercised(a.scenario)]
        first = arrivals[hits[0]] if hits else None
        rows.append(ReachRow(f.name, f.meaning, sum(len(g) for g in drawn), sum(per_seed),
                             len(hits), first.seconds if first else None,
                             hits[0] + 1 if hits else None, per_example, len(drawn),
                             sum(n > 0 for n in per_seed)))
    return rows


def print_reach(rows: Sequence[ReachRow], run_examples: int) -> None:
    drawn = rows[0].drawn if rows else 0
    print(f"\n{'field':15} {'share':>7} {'seeds':>5} {'fuzz hits':>10} {'first s':>8} "
          f"{'first #':>8} {'expected s':>10} {'goal':>4}  meaning")
    for row in rows:
        first_s = "never" if row.first_s is None else f"{row.first_s:.1f}"
        first_n = "never" if row.first_example is None else str(row.first_example)
        expected = row.expected_s()
        shown = "never" if expected is None else f"{expected:.1f}"
        seeds = f"{row.seeds_reaching}/{row.seeds}"
        print(f"{row.field:15} {100 * row.share:6.1f}% {seeds:>5} "
              f"{row.run_hits:>4}/{run_examples:<5} "
              f"{first_s:>8} {first_n:>8} {shown:>10} {'yes' if row.meets_goal() else 'NO':>4}"
              f"  {row.meaning}")
    print(f"share: of {drawn} reference examples drawn without a world; seeds: the seeds of "
          f"those draws ({DRAWS_PER_SEED} examples, about a {GOAL_S:.0f} s search, each) with "
          f"one exercising the field; fuzz hits, first s, first #: the reference fuzz on the "
          f"sim world; expected s = its seconds per example / share; goal: expected <= "
          f"{GOAL_S:.0f} s and every seed reaching it (NO: a slip there may well be missed)")


def drawn_sample(seeds: Sequence[int], per_seed: int = DRAWS_PER_SEED
                 ) -> list[list[Scenario]]:
    """`per_seed` drawn examples from each seed, one group per seed."""
    return [drawn_examples(per_seed, seed) for seed in seeds]


def print_reach_table(seconds: float, seed: int | None = None) -> None:
    """Draw, fuzz for `seconds` on the sim world, classify, print."""
    seed = random.randrange(2**32 - DRAW_SEEDS) if seed is None else seed
    drawn = drawn_sample(range(seed, seed + DRAW_SEEDS))
    arrivals, note = fuzzed_examples(seconds, seed)
    print(f"\nreach of the reference search: {sum(map(len, drawn))} examples drawn without "
          f"a world (seeds {seed}..{seed + DRAW_SEEDS - 1}); a {seconds:.0f} s fuzz on the sim "
          f"world (seed {seed}) ran {len(arrivals)}")
    if note:
        print(note)
    print_reach(reach_rows(drawn, arrivals), len(arrivals))
