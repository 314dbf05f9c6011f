"""The version table (docs/vllm.md §10): the reference search of `fuzz --sut vllm` (and of
`--exec vllm`), from an empty database and with a fixed budget, against each vLLM it is given,
and for each known bug family whether it was found as itself, how fast, and its shrunk steps.

A vLLM is an interpreter that imports it (`--python`, default this one) or a checkout
(`--vllm-src`, over this interpreter's vLLM). Each search is a `python -m harness fuzz ...
--json` subprocess, bounded by its budget plus a margin, so one version's vLLM never shares a
process with another's.

    python -m harness.bench.versions --python .venv/bin/python --python /tmp/venv33/bin/python
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.fuzz.variants import detection

ROOT = Path(__file__).resolve().parents[2]
EXEC_WORLD = ("--world", "torchrun", "--nproc", "2")


@dataclass(frozen=True)
class Family:
    """A known bug family: the search that hunts it and the checkers that name it, and the
    first release with the surface it lives on (an older one refuses its search as bad input)."""

    name: str
    flags: tuple[str, ...]
    caught_by: tuple[str, ...]
    since: str = "0.33"


SEARCH = "harness/bench/version_searches"  # the config files of the 0.34 draft searches
# The project's fixes of the guard, of 0.34's twin thresholds and of #55586, as the release
# tested needs them (harness/vllm_code/fixes.py): a family hunted beside them is not found as
# them (a faulted search of vLLM's execution finds #55586 within seconds).
GUARD_FIX = ("--vllm-fix", "last-region-start.diff")
TWINS_FIX = ("--vllm-fix", "twin-threshold-by-query-len.diff")
UNWIND_FIX = ("--vllm-fix", "pr55586-unwind.diff")


FAMILIES = (
    # max_num_reqs 64 makes every twin reachable, so the guard is what is left to find.
    Family("guard equality (2*min < G, k=2)", ("--sut", "vllm", "--max-num-reqs", "64",
                                               "--num-ubatches", "2"),
           ("no_empty_region", "differential")),
    Family("literal 2 at k=3", ("--sut", "vllm", "--max-num-reqs", "64", "--num-ubatches", "3"),
           ("no_empty_region", "differential")),
    Family("unreachable twins", ("--sut", "vllm", *GUARD_FIX), ("graphs_reachable",)),
    Family("#55586 sibling-failure hang", ("--sut", "vllm", "--exec", "vllm", "--variant",
                                           "vllm-exec-hang", *EXEC_WORLD), ("liveness",)),
    Family("#55586 recv_hook crash", ("--sut", "vllm", "--exec", "vllm", "--variant",
                                      "vllm-exec-crash", *EXEC_WORLD), ("errors",)),
    # 0.34's speculative decoding under DBO (docs/vllm.md §9, scenarios/vllm/0.34/).
    Family("guard equality on drafts", ("--sut", "vllm", "--mode", "FULL_DECODE_ONLY",
                                        "--max-num-reqs", "64", "--config",
                                        f"{SEARCH}/drafts-q3.json"),
           ("no_empty_region", "differential"), since="0.34"),
    Family("twins of narrower draft lengths", ("--sut", "vllm", "--mode", "FULL_DECODE_ONLY",
                                               "--max-num-reqs", "64", "--config",
                                               f"{SEARCH}/drafts-q4.json", *GUARD_FIX),
           ("graphs_reachable",), since="0.34"),
    Family("requests cut by untrimmed drafts", ("--sut", "vllm", "--exec", "vllm", "--mode",
                                                "FULL_AND_PIECEWISE", "--config",
                                                f"{SEARCH}/verify-q4.json", *GUARD_FIX,
                                                *UNWIND_FIX, *EXEC_WORLD),
           ("tokens_in_their_requests", "matches_reference"), since="0.34"),
    # 0.34's fault tolerance: dead DP ranks left out only where a survivor was told (§7.25);
    # every twin reachable, as above, and the draft families never draw dead ranks.
    Family("dead rank told late", ("--sut", "vllm", "--max-num-reqs", "64", "--config",
                                   f"{SEARCH}/fault-tolerance.json", *GUARD_FIX,
                                   *TWINS_FIX),
           ("dead_slots_left_out", "agreement", "differential"), since="0.34"),
)


@dataclass(frozen=True)
class Target:
    """One vLLM to search: an interpreter, and a checkout over its vLLM if given."""

    python: str
    vllm_src: str | None = None

    def flags(self) -> tuple[str, ...]:
        return ("--vllm-src", self.vllm_src) if self.vllm_src else ()


@dataclass(frozen=True)
class Cell:
    target: str  # the vLLM searched, as `fuzz` names it
    family: str
    # "found", "found as CHECKER" (a miss), "not found", or "error: ..."; a found one that
    # failed on some of its runs only ends ", intermittent (r/N)".
    verdict: str
    seconds: float | None  # to detection
    examples: int | None
    steps: str  # the shrunk scenario's token counts per step, "" when nothing was found


def search_command(target: Target, family: Family, seconds: float, seed: int) -> list[str]:
    return [target.python, "-m", "harness", "fuzz", *family.flags, *target.flags(),
            "--seconds", str(seconds), "--shrink-seconds", str(seconds), "--no-database",
            "--hypothesis-seed", str(seed), "--json", "--log", "/dev/null",
            "--found-dir", str(ROOT / ".harness" / "versions")]


def _tokens(rank: int | dict) -> int:
    """A rank's token count in a scenario file: a bare count, {"tokens": n} or its requests'
    query lengths (harness/scenario.py)."""
    if isinstance(rank, int):
        return rank
    return rank["tokens"] if "tokens" in rank else sum(rank.get("query_lens", ()))


def _steps(scenario: dict | None) -> str:
    if not scenario:
        return ""
    return " ".join("[" + ",".join(str(_tokens(r)) for r in step["ranks"]) + "]"
                    for step in scenario.get("steps", ()))


def cell_of(family: Family, returncode: int, stdout: str, stderr: str) -> Cell:
    """One search's result read from its JSON line; a search that ended otherwise is an
    error cell naming its last line, never 'not found'."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if returncode == 2 and family.since != FAMILIES[0].since:
        # A release before `since` refuses the search's config: the surface is not there.
        last = (stderr.strip().splitlines() or ["bad input"])[-1]
        return Cell("?", family.name, f"n/a (before {family.since}): {last}", None, None, "")
    if returncode not in (0, 1) or not lines:
        last = (stderr.strip().splitlines() or [f"exit {returncode}"])[-1]
        return Cell("?", family.name, f"error: {last}", None, None, "")
    result = json.loads(lines[-1])
    target = (result.get("vllm") or {}).get("version", "?")
    verdict = detection(family.caught_by, result["found"], result["checker"])
    if not result["found"]:
        return Cell(target, family.name, verdict, None, result["examples"], "")
    if result.get("kind") not in (None, "reproducible"):
        verdict = f"{verdict}, {result['kind']}"  # failed on some of its runs only
    return Cell(target, family.name, verdict, result["seconds_to_detection"],
                result["examples_to_detection"], _steps(result["scenario"]))


Runner = Callable[[list[str], float], tuple[int, str, str]]


def run_bounded(command: list[str], timeout_s: float) -> tuple[int, str, str]:
    try:
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return 124, "", f"the search ran past {timeout_s:.0f} s"
    return done.returncode, done.stdout, done.stderr


def version_table(targets: Sequence[Target], seconds: float, seed: int,
                  run: Runner = run_bounded,
                  families: Sequence[Family] = FAMILIES) -> list[Cell]:
    cells = []
    for target in targets:
        for family in families:
            # Budget, shrinking and a vLLM import and world start of up to two minutes.
            code, out, err = run(search_command(target, family, seconds, seed),
                                 2 * seconds + 180)
            cells.append(cell_of(family, code, out, err))
    return cells


def print_table(cells: Sequence[Cell]) -> None:
    width = max(len(c.family) for c in cells)
    print(f"{'vllm':18} {'bug family':{width}}  {'verdict':28} {'to detection':>14}  shrunk steps")
    for c in cells:
        found = "" if c.seconds is None else f"{c.seconds:.1f}s/{c.examples}"
        print(f"{c.target:18} {c.family:{width}}  {c.verdict:28} {found:>14}  {c.steps}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", default=[],
                        help="an interpreter whose vllm to search (repeatable; default this one)")
    parser.add_argument("--vllm-src", action="append", default=[], metavar="DIR",
                        help="a checkout to search over this interpreter's vLLM (repeatable)")
    parser.add_argument("--seconds", type=float, default=60.0, help="budget of each search")
    parser.add_argument("--seed", type=int, default=0, help="the searches' Hypothesis seed")
    parser.add_argument("--family", action="append", default=[], metavar="NAME",
                        help="only this family (repeatable; default every one)")
    args = parser.parse_args(argv)
    names = {f.name: f for f in FAMILIES}
    unknown = [n for n in args.family if n not in names]
    if unknown:
        print(f"error: --family: no family {unknown[0]!r} (known: {', '.join(names)})",
              file=sys.stderr)
        return 2
    families = [names[n] for n in args.family] or list(FAMILIES)
    targets = [Target(p) for p in args.python or ([] if args.vllm_src else [sys.executable])]
    targets += [Target(sys.executable, src) for src in args.vllm_src]
    start = time.monotonic()
    cells = version_table(targets, args.seconds, args.seed, families=families)
    print_table(cells)
    print(f"\n{len(targets)} vLLM(s), {len(families)} families, {args.seconds:.0f} s budget each, "
          f"seed {args.seed}: {time.monotonic() - start:.0f} s")
    return 3 if any(c.verdict.startswith("error") for c in cells) else 0


if __name__ == "__main__":
    sys.exit(main())
