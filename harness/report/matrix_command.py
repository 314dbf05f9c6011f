"""`python -m harness matrix`: the verdict matrix of vLLM patches over checked configs.

    python -m harness matrix --sut vllm --vllm-patch A.diff --vllm-patch B.diff \
        [--ks 2,3,4] [--dps 2,3] [--examples N | --seconds S] [--out DIR] [--json]
        [--staged-row]

Rows: vLLM without patches, then with each patch alone (with --staged-row, last, the
harness's real-token staging policy, docs/spec.md §3.4); columns: every (k, DP size). Writes
matrix.md, matrix.png and matrix.json to --out; prints the table (or, with --json, one JSON
object). Exit 0 when every cell ran, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys

from harness.cli_config import (
    add_config_flags,
    add_timeout_flags,
    config_fields_from_args,
    int_list,
    output_dir,
    timeouts_from_args,
)
from harness.cli_vllm import add_vllm_flags, tested_vllm, tested_vllm_json, vllm_fields
from harness.config import HarnessConfig
from harness.errors import ConfigError
from harness.fuzz.engine import FUZZ_TIMEOUTS, Budget
from harness.fuzz.matrix import (
    MatrixCell,
    MatrixColumn,
    cell_fields,
    row_runs,
    rows_for,
    run_matrix,
)
from harness.report.matrix import matrix_markdown, matrix_png
from harness.world import WORLDS, add_backend_flags, check_execution_backend
from harness.world.pool import WorldPool

DEFAULT_EXAMPLES = 200
# Enough requests that every twin is reachable: the guard is what the matrix is about.
DEFAULT_PINS = {"max_num_reqs": 64}


def add_matrix_command(sub) -> argparse.ArgumentParser:
    mx = sub.add_parser("matrix", help="fuzz vLLM without and with each patch on each config "
                        "and tabulate found/clean (markdown, PNG, JSON)")
    mx.add_argument("--sut", choices=["vllm"], default="vllm",
                    help="the system whose patches are compared (vllm)")
    mx.add_argument("--exec", dest="execution", choices=["harness", "vllm"], default="harness",
                    help="vllm: columns hunt vLLM's execution code under microbatch faults "
                    "(a hang, a crash) instead of fuzzing its decisions")
    mx.add_argument("--ks", default="2,3,4", metavar="K,K", help="microbatch counts (columns)")
    mx.add_argument("--dps", default="2,3", metavar="N,N", help="DP sizes (columns)")
    mx.add_argument("--world", choices=WORLDS, default="sim")
    add_backend_flags(mx)
    budget = mx.add_argument_group("budget (per cell)")
    budget.add_argument("--examples", type=int, metavar="N",
                        help=f"world runs at most (default {DEFAULT_EXAMPLES} unless --seconds)")
    budget.add_argument("--seconds", type=float, metavar="S", help="search time")
    budget.add_argument("--shrink-seconds", type=float, default=30.0, metavar="S")
    mx.add_argument("--hypothesis-seed", type=int, default=0, metavar="N",
                    help="the same seed for every cell (default 0)")
    mx.add_argument("--out", default="report/matrix", metavar="DIR",
                    help="where matrix.md, matrix.png and matrix.json go")
    mx.add_argument("--json", action="store_true", help="print one JSON object")
    mx.add_argument("--staged-row", action="store_true",
                    help="add a last row: the harness's real-token staging policy ("
                    "staging, docs/spec.md §3.4) fuzzed on every config, its own decisions")
    add_timeout_flags(mx, FUZZ_TIMEOUTS)
    add_config_flags(mx)
    add_vllm_flags(mx, sut_flag=False, differential=True)
    mx.set_defaults(func=cmd_matrix)
    return mx


def _positive_list(field: str, text: str, least: int) -> list[int]:
    values = int_list(field, text) or []
    if not values:
        raise ConfigError(field, "needs at least one value")
    bad = next((v for v in values if v < least), None)
    if bad is not None:
        raise ConfigError(field, f"holds {bad}; each must be at least {least}")
    return list(dict.fromkeys(values))


def _budget(args: argparse.Namespace) -> tuple[Budget, str]:
    if args.examples is not None and args.examples <= 0:
        raise ConfigError("examples", f"must be positive, got {args.examples}")
    if args.seconds is not None and args.seconds <= 0:
        raise ConfigError("seconds", f"must be positive, got {args.seconds}")
    examples = args.examples if args.examples or args.seconds else DEFAULT_EXAMPLES
    words = [f"{examples} examples" if examples else "", f"{args.seconds:g} s" if args.seconds
             else "", f"seed {args.hypothesis_seed}"]
    return (Budget(examples=examples, seconds=args.seconds, shrink_seconds=args.shrink_seconds),
            "budget per cell: " + ", ".join(w for w in words if w))


def cmd_matrix(args: argparse.Namespace) -> int:
    check_execution_backend(args.execution, args.backend, args.device)
    ks, dps = _positive_list("ks", args.ks, 2), _positive_list("dps", args.dps, 2)
    vllm = vllm_fields(args, "vllm", each_alone=True)
    patches = vllm.pop("vllm_patches")
    if not patches and not vllm.get("vllm_src"):
        raise ConfigError("vllm_patch", "the matrix compares patches: give --vllm-patch FILE "
                          "(repeatable) or --vllm-src DIR")
    fixed = {**DEFAULT_PINS, **config_fields_from_args(args), **vllm}
    budget, budget_text = _budget(args)
    out = output_dir("out", args.out)
    if args.staged_row and args.execution == "vllm":
        raise ConfigError("staged_row", "stages the harness's own decisions; with --exec vllm "
                          "every column hunts vLLM's execution code")
    rows = rows_for(patches, staged=args.staged_row)
    hunts = (("vllm-exec-hang", "vllm-exec-crash") if args.execution == "vllm"
             else ("vllm",))
    columns = [MatrixColumn(k, dp, hunt) for dp in dps for hunt in hunts for k in ks]
    for row in rows:  # every cell's config is legal before minutes of fuzzing
        for column in columns:
            if row_runs(row, column):
                HarnessConfig.of(**cell_fields(row, column, fixed))
    tested = tested_vllm(HarnessConfig.of(**vllm)).removeprefix("vllm under test: ")
    if not args.json:
        print(f"vllm under test: {tested}; {budget_text}", flush=True)

    def show(cell: MatrixCell) -> None:
        if not args.json:
            verdict = f"found by {cell.checker}{cell.intermittent}" if cell.found else "clean"
            print(f"  {cell.row:28} {cell.column.label:10} {verdict} ({cell.examples} "
                  f"examples, {cell.seconds:.1f} s)", flush=True)

    cells: list[MatrixCell] = []
    for dp in dps:
        timeouts = timeouts_from_args(args)
        with WorldPool(args.world, args.backend, timeouts,
                       None if args.world == "sim" else dp, args.device,
                       preload_vllm=args.execution == "vllm") as pool:
            cells += run_matrix(
                rows, [c for c in columns if c.dp_size == dp], pool.run, world=args.world,
                fixed=fixed, budget=budget, seed=args.hypothesis_seed,
                found_dir=out / "found", on_cell=show,
                replay_flags=lambda row: " ".join(f"--vllm-patch {p.path}"
                                                  for p in row.patches))
            leftover = pool.close()
        if leftover:
            print(f"error: processes of the world outlived it: {leftover}", file=sys.stderr)
            return 1
    order = {(r.name, c): i for i, (r, c) in enumerate((r, c) for r in rows for c in columns)}
    cells.sort(key=lambda cell: order[(cell.row, cell.column)])
    _write_matrix(cells, rows, out, vllm, budget_text, args.json)
    return 0


def _write_matrix(cells: list[MatrixCell], rows, out, vllm: dict, budget_text: str,
                  as_json: bool) -> None:
    """matrix.md, matrix.png and matrix.json under `out`; the table (or the JSON) printed."""
    tested = tested_vllm(HarnessConfig.of(**vllm)).removeprefix("vllm under test: ")
    markdown = matrix_markdown(cells, f"vllm under test: {tested}", budget_text)
    out.mkdir(parents=True, exist_ok=True)  # checked creatable before the search (output_dir)
    (out / "matrix.md").write_text(markdown)
    matrix_png(cells, out / "matrix.png", f"{tested}\n{budget_text}")
    data = {"vllm": tested_vllm_json(HarnessConfig.of(**vllm)),
            "rows": [{"name": r.name, "sha256": r.hashes} for r in rows],
            "budget": budget_text, "cells": [c.to_dict() for c in cells]}
    (out / "matrix.json").write_text(json.dumps(data, indent=2) + "\n")
    if as_json:
        print(json.dumps(data))
    else:
        print()
        print(markdown, end="")
        print(f"\nwritten: {out / 'matrix.md'}, {out / 'matrix.png'}, {out / 'matrix.json'}")
