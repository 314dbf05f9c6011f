"""The version table's cells are read from each search's JSON line; the searches are stood
in for (no vLLM, no world): a family is found only as itself, and a search that did not end
with a verdict is an error cell, never 'not found'."""

from __future__ import annotations

import json
from pathlib import Path

from harness.bench.versions import (
    FAMILIES,
    ROOT,
    Target,
    cell_of,
    main,
    search_command,
    version_table,
)

GUARD = FAMILIES[0]


def line(found: bool, checker: str | None = None, version: str = "0.34.0",
         kind: str | None = None) -> str:
    scenario = {"steps": [{"ranks": [{"tokens": 2}, {"query_lens": [3, 1]}]},
                          {"ranks": [3, 4]}]}
    return json.dumps({"found": found, "checker": checker, "examples": 40,
                       "seconds_to_detection": 1.25 if found else None,
                       "examples_to_detection": 7 if found else None,
                       "scenario": scenario if found else None, "vllm": {"version": version},
                       "kind": kind or ("reproducible" if found else None)})


def test_a_family_found_by_its_own_checker_is_found_with_its_time_and_shrunk_steps():
    cell = cell_of(GUARD, 1, "noise\n" + line(True, "no_empty_region"), "")
    assert (cell.target, cell.verdict, cell.seconds, cell.examples, cell.steps) == (
        "0.34.0", "found", 1.25, 7, "[2,4] [3,4]")


def test_a_family_found_by_another_checker_is_a_miss_that_names_it():
    cell = cell_of(GUARD, 1, line(True, "graphs_reachable"), "")
    assert cell.verdict == "found as graphs_reachable"


def test_a_family_found_on_some_runs_only_says_intermittent_with_its_counts():
    cell = cell_of(GUARD, 1, line(True, "no_empty_region", kind="intermittent (2/5)"), "")
    assert cell.verdict == "found, intermittent (2/5)"
    other = cell_of(GUARD, 1, line(True, "liveness", kind="intermittent (1/5)"), "")
    assert other.verdict == "found as liveness, intermittent (1/5)"


def test_a_clean_search_is_not_found_and_a_broken_one_is_an_error():
    assert cell_of(GUARD, 0, line(False), "").verdict == "not found"
    broken = cell_of(GUARD, 3, "", "warning\nerror: vllm: vllm 9.9 has an API ...")
    assert broken.verdict == "error: error: vllm: vllm 9.9 has an API ..."
    assert cell_of(GUARD, 0, "", "").verdict.startswith("error")  # exit 0 with no verdict


def test_a_release_before_a_familys_surface_refusing_its_search_is_not_applicable_not_an_error():
    drafts = next(f for f in FAMILIES if f.since == "0.34")
    refused = cell_of(drafts, 2, "", "error: decode_query_len: is 3; vLLM 0.33 rejects ...")
    assert refused.verdict.startswith("n/a (before 0.34): error: decode_query_len")
    assert cell_of(GUARD, 2, "", "error: capture_sizes: ...").verdict.startswith("error")
    assert all(Path(ROOT, f.flags[f.flags.index("--config") + 1]).is_file()
               for f in FAMILIES if "--config" in f.flags)


def test_every_family_is_searched_on_every_target_with_its_own_flags():
    ran = []

    def fake(command, timeout_s):
        ran.append((command, timeout_s))
        return 0, line(False, version=command[0]), ""

    targets = [Target("py-a"), Target("py-b", "/src/vllm")]
    cells = version_table(targets, 30.0, 5, run=fake)
    assert len(cells) == len(ran) == 2 * len(FAMILIES)
    assert [c.target for c in cells] == ["py-a"] * len(FAMILIES) + ["py-b"] * len(FAMILIES)
    for (command, timeout_s), family in zip(ran, FAMILIES * 2, strict=True):
        assert command[1:4] == ["-m", "harness", "fuzz"]
        assert all(flag in command for flag in family.flags)
        assert "--no-database" in command and command[command.index("--seconds") + 1] == "30.0"
        assert timeout_s > 60.0
    assert ran[-1][0][ran[-1][0].index("--vllm-src") + 1] == "/src/vllm"
    assert search_command(Target("py"), GUARD, 10.0, 1)[0] == "py"


def test_a_family_under_vllms_execution_but_55586_is_hunted_with_55586_fixed():
    # Else the faulted search finds #55586's crash first and the row reads "found as errors".
    for family in FAMILIES:
        executes = "--exec" in family.flags and not family.name.startswith("#55586")
        assert executes == ("pr55586-unwind.diff" in family.flags), family.name


def test_an_unknown_family_is_refused_in_one_line_naming_the_flag(capsys):
    assert main(["--family", "no such bug"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --family: no family 'no such bug'")
