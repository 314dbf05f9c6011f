"""The verdict matrix as a person reads it: rows the patches (none first), columns the
checked configs, a cell found (checker, shrunk tokens on which graph) or clean. Rendered
from cells, so no vLLM is needed."""

from __future__ import annotations

from dataclasses import replace

from harness.fuzz.matrix import MatrixCell, MatrixColumn, cell_fields, rows_for
from harness.report.matrix import matrix_markdown, matrix_png
from harness.vllm_code.source import VllmPatch, content_hash

K2, K3 = MatrixColumn(2, 2), MatrixColumn(3, 2)


def cell(row: str, column: MatrixColumn, found: bool, tokens=(), graphs=()) -> MatrixCell:
    return MatrixCell(row, column, found, "no_empty_region" if found else None, "", 40, 12.5,
                      tuple(tokens), tuple(graphs), "python -m harness run ..." if found
                      else None, "" if found else "budget spent")


CELLS = [cell("none", K2, True, [(2, 4)], (4, 8)), cell("none", K3, True, [(8, 12)], (12,)),
         cell("fix.diff", K2, False), cell("fix.diff", K3, True, [(3, 1), (8, 8)], (4, 12))]


def test_the_markdown_table_has_a_row_per_patch_and_a_column_per_config():
    lines = matrix_markdown(CELLS, "vllm under test: vllm 0.33.0", "100 examples").splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| patch"))
    assert lines[header] == "| patch | k=2, DP 2 | k=3, DP 2 |"
    assert lines[header + 2] == ("| none | **found** by no_empty_region: [2, 4] on G=4 (40 ex, "
                                 "12.5 s) | **found** by no_empty_region: [8, 12] on G=12 "
                                 "(40 ex, 12.5 s) |")
    # The last step's tokens, on the smallest graph that holds them.
    assert lines[header + 3] == ("| fix.diff | clean (40 ex, 12.5 s) | **found** by "
                                 "no_empty_region: [8, 8] on G=12 (40 ex, 12.5 s) |")


def test_the_png_is_written(tmp_path):
    out = matrix_png(CELLS, tmp_path / "m.png", "title")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cells_round_trip_through_json_and_rows_start_unpatched():
    assert all(MatrixCell.from_dict(c.to_dict()) == c for c in CELLS)
    text = "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    patch = VllmPatch("fix.diff", content_hash(text), text)
    rows = rows_for([patch])
    assert [r.name for r in rows] == ["none", "fix.diff"]
    base = cell_fields(rows[0], K3, {"differential_against_base": True})
    assert base["vllm_patches"] == () and base["differential_against_base"] is False
    assert cell_fields(rows[1], K3, {})["vllm_patches"] == (patch,)
    assert cell_fields(rows[1], K3, {})["ubatch_size"] == 3


def test_an_intermittent_cell_says_so_with_its_counts_and_keeps_them_through_json():
    found = cell("none", K2, True, [(2, 4)], (4, 8))
    intermittent = replace(found, kind="intermittent (1/5)")
    text = matrix_markdown([intermittent], "vllm under test: vllm 0.33.0", "100 examples")
    assert "**found** by no_empty_region, intermittent (1/5): [2, 4] on G=4" in text
    assert MatrixCell.from_dict(intermittent.to_dict()) == intermittent
    older = {k: v for k, v in found.to_dict().items() if k != "kind"}  # a matrix.json of before
    assert MatrixCell.from_dict(older).kind is None
