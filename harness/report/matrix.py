"""The verdict matrix for a person: a markdown table fit to paste into a vLLM pull request,
and the same table as a PNG. Rows are the patches (none first), columns the checked configs;
a cell is `found` (checker, shrunk tokens on which graph, examples, seconds) or `clean`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from harness.fuzz.matrix import STAGED_ROW, STAGED_VARIANT, MatrixCell, MatrixColumn


def _columns(cells: Sequence[MatrixCell]) -> list[MatrixColumn]:
    return list(dict.fromkeys(c.column for c in cells))


def _rows(cells: Sequence[MatrixCell]) -> list[str]:
    return list(dict.fromkeys(c.row for c in cells))


def cell_text(cell: MatrixCell, markdown: bool = True) -> str:
    seconds = f"{cell.seconds:.1f} s"
    if not cell.found:
        flaky = "; flaky" if cell.note.startswith("flaky") else ""
        return f"clean ({cell.examples} ex, {seconds}{flaky})"
    last = list(cell.tokens[-1]) if cell.tokens else []
    graph = next((g for g in cell.graphs if last and g >= max(last)), None)
    where = f"{last}" + (f" on G={graph}" if graph else "")
    bold = "**" if markdown else ""
    return (f"{bold}found{bold} by {cell.checker}{cell.intermittent}: {where} "
            f"({cell.examples} ex, {seconds})")


def matrix_markdown(cells: Sequence[MatrixCell], tested: str, budget: str) -> str:
    columns, rows = _columns(cells), _rows(cells)
    by = {(c.row, c.column): c for c in cells}
    lines = ["# vLLM empty-microbatch guard: verdict matrix", "",
             f"{tested}. Each cell is one `python -m harness fuzz --sut vllm` search "
             f"({budget}); `found` is shrunk to the tokens per rank shown, on the graph of G "
             "tokens; `clean` found nothing within the budget.", "",
             *([f"Row `{STAGED_ROW}`: the harness's own decisions with real-token staging "
                "(docs/spec.md §3.4), where a split step the fixed guard sends to eager keeps "
                f"its twin: `python -m harness fuzz --variant {STAGED_VARIANT}` on the "
                "column's config; `clean` is what it must be.", ""]
               if STAGED_ROW in rows else []),
             "| patch | " + " | ".join(c.label for c in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for row in rows:
        lines.append(f"| {row} | " + " | ".join(
            cell_text(by[(row, c)]) if (row, c) in by else "-" for c in columns) + " |")
    replays = [c for c in cells if c.found and c.replay]
    if replays:
        lines += ["", "Replays of the findings:", ""]
        lines += [f"- {c.row}, {c.column.label}: `{c.replay}`" for c in replays]
    return "\n".join(lines) + "\n"


def matrix_png(cells: Sequence[MatrixCell], path: str | Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns, rows = _columns(cells), _rows(cells)
    by = {(c.row, c.column): c for c in cells}
    fig, ax = plt.subplots(figsize=(2.9 * len(columns) + 2.2, 0.9 * len(rows) + 1.4))
    ax.set_xlim(0, len(columns))
    ax.set_ylim(0, len(rows))
    ax.invert_yaxis()
    for i, row in enumerate(rows):
        for j, column in enumerate(columns):
            cell = by.get((row, column))
            colour = "#eeeeee" if cell is None else ("#f4a582" if cell.found else "#a6dba0")
            ax.add_patch(plt.Rectangle((j, i), 1, 1, facecolor=colour, edgecolor="white",
                                       linewidth=2))
            text = "-" if cell is None else cell_text(cell, markdown=False).replace(
                ": ", ":\n", 1).replace(" (", "\n(", 1)
            ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=7)
    ax.set_xticks([j + 0.5 for j in range(len(columns))], [c.label for c in columns])
    ax.set_yticks([i + 0.5 for i in range(len(rows))], rows)
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title(title, fontsize=8, pad=24)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out
