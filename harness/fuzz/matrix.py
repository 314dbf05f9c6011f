"""The verdict matrix: vLLM with each patch (and without any) fuzzed on each checked config.

Rows are the patch sets, columns the configs (microbatch count k and DP size); each cell is
one budgeted search with the same seed, found (with the checker, the shrunk tokens and the
graph) or clean within the budget. Every cell is a plain fuzz run of `--sut vllm`: the same
engine, world and checkers, so a cell replays with `python -m harness fuzz`. An optional last
row fuzzes the harness's own real-token staging policy (docs/spec.md §3.4) on the same
configs, the alternative to the guard's eager fallback beside vLLM's guards.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.config import ubatching_fields
from harness.fuzz.engine import Budget, FuzzOutcome, fuzz
from harness.fuzz.variants import variant_named
from harness.history.scenario_history import ScenarioHistory
from harness.scenario import Scenario
from harness.vllm_code.source import VllmPatch

NO_PATCH = "none"
# The row of the harness's staging policy: its own decisions, a reference variant.
STAGED_ROW = "harness staged"
STAGED_VARIANT = "staged-reference"


@dataclass(frozen=True)
class MatrixColumn:
    num_ubatches: int
    dp_size: int
    # The search of the column: vLLM's decisions ("vllm"), or a hunt of its execution code
    # under microbatch faults (the EXEC_VARIANTS of `--exec vllm`).
    variant: str = "vllm"

    @property
    def label(self) -> str:
        config = f"k={self.num_ubatches}, DP {self.dp_size}"
        return config if self.variant == "vllm" else f"{self.variant}, {config}"


@dataclass(frozen=True)
class MatrixRow:
    name: str  # the patch's file name, or "none"
    patches: tuple[VllmPatch, ...]
    # A harness variant fuzzed in place of vLLM (the staging row); None: vLLM, patched.
    variant: str | None = None

    @property
    def hashes(self) -> list[str]:
        return [p.sha256 for p in self.patches]


@dataclass(frozen=True)
class MatrixCell:
    row: str
    column: MatrixColumn
    found: bool
    checker: str | None
    detail: str
    examples: int
    seconds: float
    tokens: tuple[tuple[int, ...], ...]  # the shrunk scenario's tokens per step
    graphs: tuple[int, ...]  # its capture sizes
    replay: str | None
    note: str
    kind: str | None = None  # "reproducible" or "intermittent (r/N)" when found

    @property
    def intermittent(self) -> str:
        """", intermittent (r/N)" for a finding that failed on some runs only; else ""."""
        return f", {self.kind}" if self.found and self.kind not in (None, "reproducible") \
            else ""

    def to_dict(self) -> dict[str, Any]:
        return {"row": self.row, "k": self.column.num_ubatches, "dp": self.column.dp_size,
                "variant": self.column.variant, "found": self.found, "checker": self.checker,
                "detail": self.detail,
                "examples": self.examples, "seconds": round(self.seconds, 3),
                "tokens": [list(t) for t in self.tokens], "capture_sizes": list(self.graphs),
                "replay": self.replay, "note": self.note, "kind": self.kind}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MatrixCell:
        return cls(data["row"], MatrixColumn(data["k"], data["dp"],
                                             data.get("variant", "vllm")), data["found"],
                   data["checker"], data["detail"], data["examples"], data["seconds"],
                   tuple(tuple(t) for t in data["tokens"]), tuple(data["capture_sizes"]),
                   data["replay"], data["note"], data.get("kind"))


def rows_for(patches: Sequence[VllmPatch], staged: bool = False) -> list[MatrixRow]:
    """The unpatched vLLM first, then each patch alone; with `staged`, the harness's staging
    policy last."""
    rows = [MatrixRow(NO_PATCH, ()), *(MatrixRow(p.name, (p,)) for p in patches)]
    return [*rows, MatrixRow(STAGED_ROW, (), STAGED_VARIANT)] if staged else rows


def row_runs(row: MatrixRow, column: MatrixColumn) -> bool:
    """Whether the row has a cell in the column: a harness row only where the column fuzzes
    decisions (vLLM's execution hunts are about vLLM's code alone)."""
    return row.variant is None or column.variant == "vllm"


def cell_variant(row: MatrixRow, column: MatrixColumn) -> str:
    return row.variant or column.variant


def _tokens(scenario: Scenario | None) -> tuple[tuple[int, ...], ...]:
    if scenario is None:
        return ()
    return tuple(tuple(len(r.query_lens) for r in ranks) for ranks in scenario.steps)


def cell_fields(row: MatrixRow, column: MatrixColumn,
                fixed: Mapping[str, Any]) -> dict[str, Any]:
    if row.variant is not None:  # the harness's own decisions: no vLLM code at all
        return {**fixed, **ubatching_fields(column.num_ubatches), "dp_size": column.dp_size,
                "sut": "harness", "vllm_src": None, "vllm_patches": (),
                "differential_against_base": False, **dict(variant_named(row.variant).changes)}
    fields = {**fixed, **ubatching_fields(column.num_ubatches), "dp_size": column.dp_size,
              "sut": "vllm", "vllm_patches": row.patches,
              **dict(variant_named(column.variant).changes)}
    if not row.patches and not fields.get("vllm_src"):
        fields["differential_against_base"] = False  # the base row is the base itself
    return fields


def run_matrix(rows: Sequence[MatrixRow], columns: Sequence[MatrixColumn],
               run: Callable[[Scenario], ScenarioHistory], *, world: str,
               fixed: Mapping[str, Any], budget: Budget, seed: int | None,
               found_dir: str | Path, log_path: str | Path | None = None,
               replay_flags: Callable[[MatrixRow], str] = lambda row: "",
               on_cell: Callable[[MatrixCell], None] = lambda cell: None) -> list[MatrixCell]:
    cells = []
    for row in rows:
        for column in columns:
            if not row_runs(row, column):
                continue
            variant = variant_named(cell_variant(row, column))
            outcome = fuzz(variant, run, world=world, dp_sizes=(column.dp_size,),
                           fixed=cell_fields(row, column, fixed), budget=budget,
                           database=None, log_path=log_path, scenario_dir=found_dir,
                           seed=seed, world_flags=replay_flags(row), hunt=variant.hunt)
            cell = cell_from(row, column, outcome)
            on_cell(cell)
            cells.append(cell)
    return cells


def cell_from(row: MatrixRow, column: MatrixColumn, outcome: FuzzOutcome) -> MatrixCell:
    scenario = outcome.scenario
    graphs = scenario.config.cudagraph_capture_sizes if scenario is not None else ()
    return MatrixCell(row.name, column, outcome.found, outcome.checker, outcome.detail,
                      outcome.examples, outcome.seconds, _tokens(scenario), tuple(graphs),
                      outcome.replay, outcome.note, outcome.kind)
