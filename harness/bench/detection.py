"""Time and examples to detection of every planted bug, from an empty example database and
fresh random seeds: the fuzzer's speed where it matters (part of `make bench`).

The harness's variants, then vLLM's execution bugs: #55586's hang and crash as vLLM ships
them, and the stream-order slips planted there (docs/spec.md §10.2, §11.3, §11.5), each on its
own setting (sut vllm, exec vllm); where vllm does not import, their rows say so instead of
vanishing. A bug counts as detected only when found
as itself (harness/fuzz/variants.py `detection`); a seed that found it as another checker
is a miss, shown as "found as X".

Two columns: steered, each variant's own search (its draws, faults and hunt narrow toward its
bug), and reference, its bug alone hunted by the reference's strategies (what a user's `fuzz`
runs: harness/fuzz/unsteered.py; under vLLM's execution, the reference's search there, with a
shipped bug's class filter). A slip's reference row runs on vLLM with its own bugs fixed
(KNOWN_FIXES), a shipped bug's with the others fixed, so that it times that bug alone: the
reference would find those first."""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
from dataclasses import dataclass, replace

from harness.fuzz.engine import FUZZ_TIMEOUTS, SIM_DP_SIZES, Budget, fuzz
from harness.fuzz.unsteered import REFERENCE, reference_fault_note, unsteered
from harness.fuzz.variants import (
    EXEC_DEFAULT_HUNTS,
    EXEC_VARIANTS,
    FOUND,
    NOT_FOUND,
    VARIANTS,
    Variant,
    detection,
    reference_for,
)
from harness.scenario import Scenario, scenario_from_dict
from harness.world.pool import WorldPool

GOAL_S = 30.0
# The slips planted over vLLM's execution: its own hunts (no mutation) find shipped bugs.
VLLM_SLIPS = tuple(name for name, v in EXEC_VARIANTS.items() if v.mutation.planted())
# vLLM's execution bugs as it ships them: one row per failure class the plain search hunts.
VLLM_SHIPPED = EXEC_DEFAULT_HUNTS
VLLM_ROWS = (*VLLM_SHIPPED, *VLLM_SLIPS)
# The project's fixes of vLLM's own bugs that the reference's search under its execution
# reaches (#55586's hang and crash, docs/spec.md §10.3; the guard, §7.1; 0.34's twins of
# narrower query lengths, never replayed), under the installed release's directory where they
# were rebased, else as written against 0.33.0; one written for a later release only is
# applied there only.
SHIPPED_FIX = "pr55586-unwind.diff"  # #55586's: the bug the shipped rows time
KNOWN_FIXES = (SHIPPED_FIX, "last-region-start.diff",
               "twin-threshold-by-query-len.diff", "verify-slices-by-device-layout.diff")
# vLLM's execution keeps a process per rank, so on the sim world too it runs on a torchrun
# world (harness.world.world_for): DP 2 on both, as on the torchrun world.
VLLM_DP = 2
STEERED, UNSTEERED = "steered", "reference"  # the columns: its own search, the reference's
COLUMNS = (STEERED, UNSTEERED)


@dataclass(frozen=True)
class DetectionRow:
    world: str
    variant: str
    seconds: tuple[float | None, ...]  # per seed; None: not found as itself in the budget
    examples: tuple[int | None, ...]
    skipped: str = ""  # why the row was not timed (vllm does not import); "" when it was
    # Per seed: "found", "not found" or "found as X" (another checker fired: a miss).
    detections: tuple[str, ...] = ()
    column: str = STEERED  # whose strategies hunted it: its own, or the reference's
    note: str = ""  # what the row cannot show (a fault the reference never draws)

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
    """Every name the table can time: the harness's planted bugs, then vLLM's execution
    bugs (shipped, then planted slips)."""
    return (*(name for name, v in VARIANTS.items() if not v.is_reference), *VLLM_ROWS)


def detection_rows(world: str, seeds: list[int], budget_s: float,
                   names: tuple[str, ...] | None = None,
                   columns: tuple[str, ...] = (STEERED,)) -> list[DetectionRow]:
    """Rows for every planted bug, or for those `names` only: one per column of each."""
    chosen = [name for name in timed_variants() if names is None or name in names]
    planted = [VARIANTS[name] for name in chosen if name not in VLLM_ROWS]
    slips = [name for name in chosen if name in VLLM_ROWS]
    nproc = None if world == "sim" else 2
    rows = []
    if planted:
        dp_sizes = SIM_DP_SIZES if nproc is None else (nproc,)
        with WorldPool(world, "gloo", FUZZ_TIMEOUTS, nproc) as pool:
            rows += [_row(world, variant, pool, dp_sizes, seeds, budget_s, column=column)
                     if variant.fits(dp_sizes) is None else
                     DetectionRow(world, variant.name, (), (), skipped=variant.fits(dp_sizes),
                                  column=column)
                     for variant in planted for column in columns]
    if slips:
        rows += vllm_slip_rows(world, seeds, budget_s, slips, columns)
    return rows


def vllm_slip_rows(world: str, seeds: list[int], budget_s: float, names: list[str],
                   columns: tuple[str, ...] = (STEERED,)) -> list[DetectionRow]:
    """The rows of vLLM's execution bugs; each one a skipped row where vllm does not import."""
    from harness.vllm_sut.available import installed_release, unavailable_reason, vllm_version

    if vllm_version() is None:
        why = f"vllm not installed ({unavailable_reason()})"
        return [DetectionRow(world, name, (), (), skipped=why, column=column)
                for name in names for column in columns]
    release = {"release": installed_release().value}  # the miniature models the installed one
    nproc = None if world == "sim" else VLLM_DP  # the sim world opens its torchrun one
    with WorldPool(world, "gloo", FUZZ_TIMEOUTS, nproc, preload_vllm=True) as pool:
        rows = []
        for name, column in ((name, column) for name in names for column in columns):
            variant = EXEC_VARIANTS[name]
            fixed = {**release, **alone(variant, column, release["release"])}
            # Ranks that import vLLM start in tens of seconds: started before the clock runs,
            # as the torchrun world of the harness's rows is (and on the code it hunts), and
            # again before each seed, whose world a hang of the seed before left to relaunch.
            row = _row(world, variant, pool, (VLLM_DP,), seeds, budget_s, fixed, column,
                       warm=warm_up(variant, fixed))
            fix = ", ".join(p.name for p in fixed.get("vllm_patches", ()))
            rows.append(replace(row, note=f"on vLLM with {fix}") if fix else row)
    return rows


def alone(variant: Variant, column: str, release: str) -> dict:
    """The fields that leave `variant`'s bug alone in `column`. Hunted by the reference, a slip
    runs on vLLM with its known bugs fixed (its faults would find #55586 first, its decisions
    the guard), and a shipped class with every known bug fixed but #55586 itself (a fault-free
    example's failure counts in a class hunt: the guard would be found first). Its own search
    needs none."""
    if column == STEERED or variant.name not in VLLM_ROWS:
        return {}
    unfixed = (SHIPPED_FIX,) if variant.name in VLLM_SHIPPED else ()
    return {"vllm_patches": known_fixes(release, unfixed)}


def known_fixes(release: str, unfixed: tuple[str, ...] = ()) -> tuple:
    """KNOWN_FIXES but those named in `unfixed`, as written against `release` ("0.34"), else
    against 0.33.0, where there is one."""
    from harness.vllm_code.fixes import fix_path
    from harness.vllm_code.source import read_patch

    found = [fix_path(name, release) for name in KNOWN_FIXES if name not in unfixed]
    return tuple(read_patch(path) for path in found if path is not None)


def warm_up(variant: Variant, fixed: dict | None = None) -> Scenario:
    """One plain decode step on the variant's setting without its slip: it opens the world
    the variant's examples run on."""
    config = {"dp_size": VLLM_DP, **dict(variant.setting), **(fixed or {})}
    return scenario_from_dict({"config": config,
                               "steps": [{"ranks": [{"tokens": 4}] * VLLM_DP}]})


def _row(world: str, variant: Variant, pool: WorldPool, dp_sizes: tuple[int, ...],
         seeds: list[int], budget_s: float, fixed: dict | None = None,
         column: str = STEERED, warm: Scenario | None = None) -> DetectionRow:
    hunted = variant if column == STEERED else unsteered(variant)
    seconds, examples, detections = [], [], []
    for seed in seeds:
        if warm is not None:  # off the clock: the world each seed starts from is ready
            pool.run(warm)
        # Detection only: no shrinking, so every seed costs at most the budget. The finding's
        # file is not read here: its folder goes with the seed.
        with tempfile.TemporaryDirectory(prefix="dbo-bench-found-") as scratch:
            outcome = fuzz(hunted, pool.run, world=world, dp_sizes=dp_sizes,
                           budget=Budget(seconds=budget_s, shrink_seconds=0.0), database=None,
                           seed=seed, scenario_dir=scratch, hunt=hunted.hunt, fixed=fixed)
        shown = detection(hunted.caught_by, outcome.found, outcome.checker)
        itself = shown == FOUND
        seconds.append(outcome.seconds_to_detection if itself else None)
        examples.append(outcome.examples_to_detection if itself else None)
        detections.append(shown)
        _progress(world, variant.name, column, seed, shown, seconds[-1], examples[-1])
    note = "" if column == STEERED else reference_fault_note(variant)
    return DetectionRow(world, variant.name, tuple(seconds), tuple(examples),
                        detections=tuple(detections), column=column, note=note)


def _progress(world: str, name: str, column: str, seed: int, shown: str,
              seconds: float | None, examples: int | None) -> None:
    # The table prints at the end of a long run: each seed's result as it comes, on stderr,
    # so that a run cut short keeps what it measured.
    took = "" if seconds is None else f" in {seconds:.1f} s, {examples} examples"
    print(f"detection {world} {name} ({column}) seed {seed}: {shown}{took}", file=sys.stderr,
          flush=True)


def random_seeds(count: int) -> list[int]:
    return [random.randrange(2**32) for _ in range(count)]


PER_SEED = "per seed (s/examples)"


def print_detection(rows: list[DetectionRow]) -> None:
    """One line per world and variant, its columns (steered, reference) side by side."""
    columns = [c for c in COLUMNS if any(row.column == c for row in rows)]
    groups: dict[tuple[str, str], dict[str, DetectionRow]] = {}
    for row in rows:
        groups.setdefault((row.world, row.variant), {})[row.column] = row
    cells = {key: [_cells(group.get(c)) for c in columns] for key, group in groups.items()}
    seed_widths = [max([len(PER_SEED), *(len(cell[i][-1]) for cell in cells.values())])
                   for i in range(len(columns))]
    width = max([len("variant"), *(len(row.variant) for row in rows)])
    head = f"\n{'world':9} {'variant':{width}}" + "".join(
        f" | {c + ' found':>15} {'median s':>8} {'worst s':>7} {f'<{GOAL_S:.0f}s':>4} "
        f"{PER_SEED:{w}}" for c, w in zip(columns, seed_widths, strict=True))
    print(head.rstrip())
    for (world, variant), group in groups.items():
        line = f"{world:9} {variant:{width}}"
        skipped = next((row.skipped for row in group.values() if row.skipped), "")
        if skipped:
            print(f"{line} skipped: {skipped}")
            continue
        for (found, median, worst, met, per_seed), w in zip(cells[(world, variant)],
                                                            seed_widths, strict=True):
            line += f" | {found:>15} {median:>8} {worst:>7} {met:>4} {per_seed:{w}}"
        notes = [f"{c}: {text}" for c in columns if c in group for text in _notes(group[c])]
        print(line.rstrip() + (f"  ({'; '.join(notes)})" if notes else ""))
    _print_legend(rows, columns)


def _cells(row: DetectionRow | None) -> tuple[str, str, str, str, str]:
    """found, median, worst, goal met, and per seed seconds/examples ("-": not as itself)."""
    if row is None:
        return "", "", "", "", "not run"
    worst = row.worst_s()
    per_seed = ", ".join("-" if s is None else f"{s:.1f}/{e}"
                         for s, e in zip(row.seconds, row.examples, strict=True))
    met = "yes" if worst is not None and worst < GOAL_S else "NO"
    return (f"{row.found}/{len(row.seconds)}", _fmt(row.median_s()), _fmt(worst), met,
            per_seed)


def _notes(row: DetectionRow) -> list[str]:
    misses = sorted({d for d in row.detections if d not in (FOUND, NOT_FOUND)})
    return ([f"{'; '.join(misses)}: misses"] if misses else []) + ([row.note] if row.note else [])


def _print_legend(rows: list[DetectionRow], columns: list[str]) -> None:
    print(f"{PER_SEED}: seconds and examples to detection as itself; -: not found as "
          f"itself within the budget")
    if UNSTEERED in columns:
        print(f"{STEERED}: the variant's own search (its draws, faults and hunt); "
              f"{UNSTEERED}: its bug alone under the reference's search ("
              f"{_reference_draws(REFERENCE)}, no hunt filter)")
    if UNSTEERED in columns and any(row.variant in VLLM_ROWS for row in rows):
        print(f"{UNSTEERED} under vLLM's execution: {_reference_draws(_EXEC_REFERENCE)}, "
              f"configs leaning to eager microbatched steps; {', '.join(VLLM_SHIPPED)} keep "
              f"their class filter on faulted examples (the plain --sut vllm --exec vllm "
              f"hunts each class)")
    if any(row.variant in VLLM_ROWS and not row.skipped for row in rows):
        print(f"{', '.join(VLLM_ROWS)}: sut vllm, exec vllm, DP {VLLM_DP} on torchrun rank "
              f"processes on either world (vLLM's execution keeps a process per rank)")


_EXEC_REFERENCE = reference_for((("execution", "vllm"),))


def _reference_draws(reference: Variant) -> str:
    faults = ", ".join(kind.value for kind in reference.fault_kinds) or "none"
    drafts = (f"drafts in 1 config in {reference.drafts_every}" if reference.drafts_every
              else "no drafts")
    return (f"k from {reference.ubatch_counts}, {drafts}, faults {faults} in 1 scenario in "
            f"{reference.fault_every}")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
