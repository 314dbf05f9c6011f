"""No silently bent input: every value a command cannot honour is one line on stderr naming
its field, with exit code 2, before any world runs; never a traceback, a clamp or a green run
that skipped what was asked.

Rows are argv with placeholders filled in per test: {tmp} a fresh directory, {file} a plain
file in it, {scenario} a valid scenario file, {log} a valid run log, {binary} a file that is
not UTF-8. Each row names the field its one line must start with.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import EXIT_BAD_INPUT, main
from harness.fuzz.variants import SUT_VARIANTS, VARIANTS
from harness.scenario import CHECKERS

SCENARIO = {"steps": [{"ranks": [4, 4]}]}
LOG_ENTRY = {"type": "finding", "run": "r", "variant": "reference", "world": "sim",
             "found": False, "checker": None, "scenario": None, "examples": 1, "seconds": 1.0,
             "replay": None}


@pytest.fixture
def places(tmp_path, monkeypatch) -> dict[str, str]:
    # Run in the test's own directory: a default path (.hypothesis, report) lands there.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("not a directory\n")
    (tmp_path / "scenario.json").write_text(json.dumps(SCENARIO))
    (tmp_path / "log.jsonl").write_text(json.dumps(LOG_ENTRY) + "\n")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe{}")
    return {"tmp": str(tmp_path), "file": str(tmp_path / "file"),
            "scenario": str(tmp_path / "scenario.json"), "log": str(tmp_path / "log.jsonl"),
            "binary": str(tmp_path / "binary.json")}


def rejected_line(argv: list[str], places: dict[str, str], capsys) -> str:
    """Run the command; assert exit 2, one line on stderr and no traceback; the line."""
    argv = [arg.format(**places) for arg in argv]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own one-line errors
        code = exc.code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == EXIT_BAD_INPUT, (code, err)
    assert len(lines) == 1, err
    return lines[0]


def assert_names(line: str, field: str) -> None:
    assert line.startswith(f"error: {field}: "), line


DECIDE = ["decide", "--tokens", "64,64"]


@pytest.mark.parametrize("flags, field", [
    (["--timeout", "0"], "timeout"),
    (["--timeout", "-1"], "timeout"),
    (["--timeout", "nan"], "timeout"),
    (["--timeout", "inf"], "timeout"),
    (["--timeout", "1e12"], "timeout"),
    (["--tokens", "64,,64"], "tokens"),
    (["--capture-sizes", "64,,128"], "capture_sizes"),
    (["--uct", "1,,1"], "uct"),
    (["--reqs", "64,64,"], "reqs"),
    (["--num-ubatches", "3", "--no-ubatching"], "num_ubatches"),
    (["--threshold-offset", "5"], "threshold_offset"),
    (["--threshold-offset-rank", "1"], "threshold_offset_rank"),
    (["--max-num-reqs", "2147483648", "--max-num-batched-tokens", "2147483648"],
     "max_num_reqs"),
    (["--seed", str(10**20)], "seed"),
    (["--config", ""], "config"),
    (["--config", "{binary}"], "config"),
])
def test_decide_rejects_each_bad_value_in_one_line_naming_its_field(
        flags, field, places, capsys):
    assert_names(rejected_line([*DECIDE, *flags], places, capsys), field)


@pytest.mark.parametrize("fields, field", [
    ({"enable_dbo": "no"}, "enable_dbo"),
    ({"single_rank_gpu_world": 0}, "single_rank_gpu_world"),
    ({"capture_sizes": 64}, "capture_sizes"),
    ({"threshold_offset": "5", "threshold_offset_rank": 0}, "threshold_offset"),
    ({"threshold_offset": 1.5, "threshold_offset_rank": 0}, "threshold_offset"),
    ({"threshold_offset": 4, "threshold_offset_rank": True}, "threshold_offset_rank"),
    ({"seed": "x"}, "seed"),
    ({"config": {"dp_size": 2}, "max_num_reqs": 8}, "max_num_reqs"),
])
def test_a_config_file_field_that_would_be_misread_is_one_line_naming_it(
        fields, field, places, capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(fields))
    line = rejected_line([*DECIDE, "--config", str(tmp_path / "config.json")], places, capsys)
    assert_names(line, field)


def test_a_key_given_twice_in_a_json_file_is_one_line_naming_the_file(
        places, capsys, tmp_path):
    (tmp_path / "config.json").write_text('{"max_num_reqs": 64, "max_num_reqs": 8}')
    line = rejected_line([*DECIDE, "--config", str(tmp_path / "config.json")], places, capsys)
    assert_names(line, "config")
    assert "`max_num_reqs` twice" in line


RUN = ["run", "--world", "sim", "--scenario", "{scenario}"]


@pytest.mark.parametrize("flags, field", [
    (["--collective-timeout", "nan"], "collective_timeout"),
    (["--collective-timeout", "-1"], "collective_timeout"),
    (["--hang-timeout", "inf"], "hang_timeout"),
    (["--deadline", "1e12"], "deadline"),
    (["--scenario", "{binary}"], "scenario"),
])
def test_run_rejects_each_bad_value_in_one_line_naming_its_field(flags, field, places, capsys):
    assert_names(rejected_line([*RUN, *flags], places, capsys), field)


STEP = {"ranks": [20, 24]}
FAULT = {"kind": "slow_rank", "rank": 0, "step": 0}


@pytest.mark.parametrize("changes, field", [
    ({"name": 5}, "name"),
    ({"description": {}}, "description"),
    ({"steps": [{**STEP, "repeat": 2}]}, "steps[0].repeat"),
    ({"steps": [{"ranks": [10**12, 4]}]}, "steps[0].tokens"),
    ({"faults": [{**FAULT, "sleep": 1}]}, "faults[0].sleep"),
    ({"faults": [{**FAULT, "seconds": float("nan")}]}, "faults[0].seconds"),
    ({"faults": [{**FAULT, "kind": "raise_in_ubatch", "seconds": 1.0}]}, "faults[0].seconds"),
    ({"expect": {"caught_by": 5}}, "expect.caught_by"),
    ({"expect": {"caught_by": "nobody"}}, "expect.caught_by"),
    ({"expect": {"caught_by_on": {"cuda": "nobody"}}}, "expect.caught_by_on.cuda"),
    ({"expect": {"cought_by": "agreement"}}, "expect.cought_by"),
    ({"expect": {"caught_by": "agreement", "reference": {"bogus": 1}}},
     "expect.reference.bogus"),
])
def test_a_scenario_field_that_would_be_ignored_or_crash_is_one_line_naming_it(
        changes, field, places, capsys, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"steps": [STEP], **changes}))
    line = rejected_line(["run", "--world", "sim", "--scenario", str(path)], places, capsys)
    assert_names(line, field)


@pytest.mark.parametrize("flags, field", [
    (["--max-tokens", "999999999"], "max_tokens"),
    (["--max-tokens", "-1"], "max_tokens"),
    (["--nproc", "100000"], "nproc"),
    (["--nproc", "4", "--max-num-reqs", "100000", "--max-num-batched-tokens", "100000",
      "--max-tokens", "512"], "max_tokens"),
])
def test_exhaustive_rejects_each_bound_it_cannot_honour_in_one_line_naming_its_field(
        flags, field, places, capsys):
    assert_names(rejected_line(["exhaustive", *flags], places, capsys), field)


def test_exhaustive_says_the_largest_bound_it_honours_and_why(places, capsys):
    line = rejected_line(["exhaustive", "--max-tokens", "999999999"], places, capsys)
    assert "0 to 64" in line and "max_num_reqs=64" in line


def test_exhaustive_honours_the_largest_bound_a_decode_batch_may_hold(capsys):
    flags = ["--capture-sizes", "8,16", "--max-num-reqs", "16", "--max-num-batched-tokens",
             "24", "--decode-threshold", "2", "--prefill-threshold", "4", "--json"]
    assert main(["exhaustive", *flags, "--max-tokens", "16"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["max_tokens"] == 16 and out["vectors"] == 17 * 18 // 2


FUZZ = ["fuzz", "--examples", "1", "--no-database", "--log", "{tmp}/fuzz.jsonl",
        "--found-dir", "{tmp}/found"]


@pytest.mark.parametrize("flags, field", [
    (["--seconds", "nan"], "seconds"),
    (["--shrink-seconds", "inf"], "shrink_seconds"),
    (["--hypothesis-seed", "-1"], "hypothesis_seed"),
    (["--collective-timeout", "nan"], "collective_timeout"),
    (["--hang-timeout", "nan"], "hang_timeout"),
    (["--seed", str(10**20)], "seed"),
    (["--log", "{tmp}"], "log"),
    (["--log", "{file}/fuzz.jsonl"], "log"),
    (["--log", ""], "log"),
    (["--found-dir", "{file}"], "found_dir"),
    (["--found-dir", ""], "found_dir"),
    (["--database", "{tmp}/db"], "database"),
    (["--variant", "guard-merged", "--guard", "strict-k2"], "guard"),
    (["--variant", "all", "--guard", "merged"], "guard"),
    (["--variant", "asymmetric-candidates", "--threshold-offset", "0"], "threshold_offset"),
    (["--variant", "guard-strict-k2", "--decode-threshold", "2"], "decode_threshold"),
])
def test_fuzz_rejects_each_bad_value_before_searching_in_one_line_naming_its_field(
        flags, field, places, capsys):
    assert_names(rejected_line([*FUZZ, *flags], places, capsys), field)


def test_fuzz_rejects_a_database_that_is_a_file_before_searching(places, capsys):
    argv = ["fuzz", "--examples", "1", "--database", "{file}", "--log", "{tmp}/fuzz.jsonl",
            "--found-dir", "{tmp}/found"]
    assert_names(rejected_line(argv, places, capsys), "database")


REPORT = ["report", "--log", "{log}", "--no-maps"]


@pytest.mark.parametrize("flags, field", [
    (["--out", "{file}"], "out"),
    (["--out", "{file}/report"], "out"),
    (["--out", ""], "out"),
    (["--out", "{tmp}/out", "--log", "{binary}"], "log"),
    (["--out", "{tmp}/out", "--log", "{log}"], "log"),
])
def test_report_rejects_each_bad_path_in_one_line_naming_its_field(
        flags, field, places, capsys):
    assert_names(rejected_line([*REPORT, *flags], places, capsys), field)
    assert not (Path(places["tmp"]) / "out").exists()  # nothing is written from bad input


def test_every_checker_a_variant_is_caught_by_may_be_expected_by_a_scenario():
    named = {c for v in (*VARIANTS.values(), *SUT_VARIANTS.values()) for c in v.caught_by}
    assert named <= set(CHECKERS)
