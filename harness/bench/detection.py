"""Time and examples to detection of every planted bug, from an empty example database and
fresh random seeds: the fuzzer's speed where it matters (part of `make bench`).

The harness's variants, then the stream-order slips planted under vLLM's execution code
(docs/spec.md §11.3, §11.5), each on its own setting (sut vllm, exec vllm); where vllm does
not import, their rows say so instead of vanishing. A bug counts as detected only when found
as itself (harness/fuzz/variants.py `detection`); a seed that found it as another checker
is a miss, shown as "found as X"."""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from harness.fuzz.engine import FUZZ_TIMEOUTS, SIM_DP_SIZES, Budget, fuzz
from harness.fuzz.variants import EXEC_VARIANTS, FOUND, NOT_FOUND, VARIANTS, Variant, detection
from harness.scenario import Scenario, scenario_from_dict
from harness.world.pool import WorldPool

GOAL_S = 30.0
# The slips planted over vLLM's execution: its own hunts (no mutation) find shipped bugs.
VLLM_SLIPS = tuple(name for name, v in EXEC_VARIANTS.items() if v.mutation.planted())
# vLLM's execution keeps a process per rank, so on the sim world too it runs on a torchrun
# world (harness.world.world_for): DP 2 on both, as on the torchrun world.
VLLM_DP = 2


@dataclass(frozen=True)
class DetectionRow:
    world: str
    variant: str
    seconds: tuple[float | None, ...]  # per seed; None: not found as itself in the budget
    examples: tuple[int | None, ...]
    skipped: str = ""  # why the row was not timed (vllm does not import); "" when it was
    # Per seed: "found", "not found" or "found as X" (another checker fired: a miss).
    detections: tuple[str, ...] = ()

    @property
    def found(self) -> int:
        return sum(s is not None for s in self.seconds)

    def median_s(self) -> float | None:
        found = [s for s in self.seconds if s is not None]
        return statistics.median(found) if found else None

    def worst_s(self) -> float | None:
        if not self.seconds or self.found < len(self.seconds):
            return None
        return max(self.seconds)


def timed_variants() -> tuple[str, ...]:
    """Every name the table can time: the harness's planted bugs, then vLLM's slips."""
    return (*(name for name, v in VARIANTS.items() if not v.is_reference), *VLLM_SLIPS)


def detection_rows(world: str, seeds: list[int], budget_s: float,
                   names: tuple[str, ...] | None = None) -> list[DetectionRow]:
    """Rows for every planted bug, or for those `names` only."""
    chosen = [name for name in timed_variants() if names is None or name in names]
    planted = [VARIANTS[name] for name in chosen if name not in VLLM_SLIPS]
    slips = [name for name in chosen if name in VLLM_SLIPS]
    nproc = None if world == "sim" else 2
    rows = []
    if planted:
        dp_sizes = SIM_DP_SIZES if nproc is None else (nproc,)
        with WorldPool(world, "gloo", FUZZ_TIMEOUTS, nproc) as pool:
            rows += [_row(world, variant, pool, dp_sizes, seeds, budget_s)
                     for variant in planted]
    if slips:
        rows += vllm_slip_rows(world, seeds, budget_s, slips)
    return rows


def vllm_slip_rows(world: str, seeds: list[int], budget_s: float,
                   names: list[str]) -> list[DetectionRow]:
    """The rows of vLLM's execution slips; each one a skipped row where vllm does not import."""
    from harness.vllm_sut.available import installed_release, unavailable_reason, vllm_version

    if vllm_version() is None:
        why = f"vllm not installed ({unavailable_reason()})"
        return [DetectionRow(world, name, (), (), skipped=why) for name in names]
    release = {"release": installed_release().value}  # the miniature models the installed one
    nproc = None if world == "sim" else VLLM_DP  # the sim world opens its torchrun one
    with WorldPool(world, "gloo", FUZZ_TIMEOUTS, nproc, preload_vllm=True) as pool:
        rows = []
        for name in names:
            variant = EXEC_VARIANTS[name]
            # Ranks that import vLLM start in tens of seconds: started before the clock runs,
            # as the torchrun world of the harness's rows is.
            pool.run(warm_up(variant, release))
            rows.append(_row(world, variant, pool, (VLLM_DP,), seeds, budget_s, release))
    return rows


def warm_up(variant: Variant, fixed: dict | None = None) -> Scenario:
    """One plain decode step on the variant's setting without its slip: it opens the world
    the variant's examples run on."""
    config = {"dp_size": VLLM_DP, **dict(variant.setting), **(fixed or {})}
    return scenario_from_dict({"config": config,
                               "steps": [{"ranks": [{"tokens": 4}] * VLLM_DP}]})


def _row(world: str, variant: Variant, pool: WorldPool, dp_sizes: tuple[int, ...],
         seeds: list[int], budget_s: float, fixed: dict | None = None) -> DetectionRow:
    seconds, examples, detections = [], [], []
    for seed in seeds:
        # Detection only: no shrinking, so every seed costs at most the budget.
        outcome = fuzz(variant, pool.run, world=world, dp_sizes=dp_sizes,
                       budget=Budget(seconds=budget_s, shrink_seconds=0.0), database=None,
                       seed=seed, scenario_dir=_scratch(), hunt=variant.hunt, fixed=fixed)
        shown = detection(variant.caught_by, outcome.found, outcome.checker)
        itself = shown == FOUND
        seconds.append(outcome.seconds_to_detection if itself else None)
        examples.append(outcome.examples_to_detection if itself else None)
        detections.append(shown)
    return DetectionRow(world, variant.name, tuple(seconds), tuple(examples),
                        detections=tuple(detections))


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
        if row.skipped:
            print(f"{row.world:9} {row.variant:{width}} skipped: {row.skipped}")
            continue
        median, worst = row.median_s(), row.worst_s()
        per_seed = ", ".join("-" if e is None else str(e) for e in row.examples)
        met = "yes" if worst is not None and worst < GOAL_S else "NO"
        misses = sorted({d for d in row.detections if d not in (FOUND, NOT_FOUND)})
        print(f"{row.world:9} {row.variant:{width}} {row.found:>3}/{len(row.seconds):<2} "
              f"{_fmt(median):>9} {_fmt(worst):>8} {per_seed:24} {met}"
              f"{'  (' + '; '.join(misses) + ': misses)' if misses else ''}")
    if any(row.variant in VLLM_SLIPS and not row.skipped for row in rows):
        print(f"{', '.join(VLLM_SLIPS)}: sut vllm, exec vllm, DP {VLLM_DP} on torchrun rank "
              f"processes on either world (vLLM's execution keeps a process per rank)")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
