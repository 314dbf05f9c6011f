"""Each checker's coverage (verdicts held, failed, not applicable) as `fuzz`, a fuzz campaign
and `report` count and print it; a run-log verdict that never said whether it applied is
unknown, never held. `run`'s coverage is tested on a world in test_sim_world.py."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path

import pytest

from harness.check.coverage import (
    CheckerCoverage,
    coverage_from_dicts,
    coverage_lines,
    coverage_of_verdicts,
    merged,
)
from harness.check.verdict import Outcome, Verdict
from harness.fuzz.command import print_coverage
from harness.fuzz.jobs import JobResult, report_jobs
from harness.fuzz.result import FuzzOutcome
from harness.fuzz.run_log import ExampleEntry, FindingEntry, VerdictEntry, append, read_log
from harness.report.build import build_report
from harness.scenario import scenario_from_dict

HELD, FAILED, NA = Outcome.HELD, Outcome.FAILED, Outcome.NOT_APPLICABLE
SCENARIO = scenario_from_dict({"config": {}, "steps": [{"ranks": [{"tokens": 4},
                                                                   {"tokens": 4}]}]}).to_dict()


def verdicts(*pairs: tuple[str, Outcome]) -> list[Verdict]:
    return [Verdict(checker, outcome, "why") for checker, outcome in pairs]


def counts(coverage) -> dict[str, tuple[int, int, int, int, int]]:
    return {c.checker: (c.judged, c.held, c.failed, c.not_applicable, c.unknown)
            for c in coverage}


def test_coverage_counts_each_checkers_verdicts_and_never_counts_not_applicable_as_held():
    coverage = coverage_of_verdicts(verdicts(
        ("captured_split", NA), ("agreement", HELD), ("captured_split", HELD),
        ("agreement", FAILED), ("differential", NA), ("differential", NA)))
    # Registry order, whatever order the verdicts came in.
    assert [c.checker for c in coverage] == ["agreement", "captured_split", "differential"]
    assert counts(coverage) == {"agreement": (2, 1, 1, 0, 0), "captured_split": (1, 1, 0, 1, 0),
                                "differential": (0, 0, 0, 2, 0)}
    lines = coverage_lines(coverage, "this run")
    assert lines[-1] == "  judged nothing: differential"
    assert next(line for line in lines if line.startswith("  captured_split")).split() == [
        "captured_split", "1", "1", "0", "1"]


def test_coverage_merges_across_searches_and_reads_back_from_its_json():
    one = coverage_of_verdicts(verdicts(("agreement", HELD), ("differential", NA)))
    two = coverage_of_verdicts(verdicts(("agreement", FAILED), ("stream_order", NA)))
    both = merged([one, two])
    assert counts(both) == {"agreement": (2, 1, 1, 0, 0), "stream_order": (0, 0, 0, 1, 0),
                            "differential": (0, 0, 0, 1, 0)}
    assert coverage_from_dicts([c.to_dict() for c in both]) == both
    with pytest.raises(ValueError, match="not a coverage row"):
        coverage_from_dicts([{"checker": "agreement", "held": 1}])


def outcome(variant: str, coverage: tuple[CheckerCoverage, ...]) -> FuzzOutcome:
    return FuzzOutcome(variant, "sim", False, None, "", None, 3, 1.0, None, None, None, None,
                       coverage=coverage)


def test_fuzz_prints_coverage_over_every_variants_examples(capsys):
    reference = outcome("reference", coverage_of_verdicts(verdicts(
        ("agreement", HELD), ("differential", NA))))
    merged_guard = outcome("guard-merged", coverage_of_verdicts(verdicts(
        ("agreement", HELD), ("differential", NA), ("captured_split", HELD))))
    print_coverage([reference, merged_guard])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("coverage over 6 examples of 2 variants")
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:-1]}
    assert rows == {"agreement": ["2", "2", "0", "0"], "captured_split": ["1", "1", "0", "0"],
                    "differential": ["0", "0", "0", "2"]}
    assert lines[-1] == "  judged nothing: differential"
    assert reference.to_json_dict()["coverage"] == [c.to_dict() for c in reference.coverage]


def test_a_fuzz_campaign_prints_coverage_over_every_jobs_examples(capsys):
    jobs = [JobResult(i, 7 + i, 0, (outcome("reference", coverage_of_verdicts(verdicts(
                ("agreement", HELD), ("differential", NA)))).to_json_dict(),),
                      Path("job.jsonl"), "", Path("job.err"), ()) for i in (1, 2)]
    assert report_jobs(jobs, ["reference"], "db", as_json=False) == 0
    out = capsys.readouterr().out
    assert "coverage over 6 examples of 2 jobs" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()
            if line.startswith("  agreement ")}
    assert rows == {"agreement": ["2", "2", "0", "0"]}


def example(*entries: VerdictEntry) -> ExampleEntry:
    return ExampleEntry("r1", "reference", "sim", SCENARIO, True, entries, 0.1)


def write_old_log(path: Path, *entries) -> Path:
    """A log as written before verdicts said whether they applied: no `applied` key."""
    with path.open("w") as f:
        for entry in entries:
            data = {"type": "example", **asdict(entry)}
            for v in data["verdicts"]:
                del v["applied"]
            f.write(json.dumps(data) + "\n")
    return path


def test_a_logged_verdict_that_never_said_whether_it_applied_reads_unknown_not_held(tmp_path):
    log = write_old_log(tmp_path / "old.jsonl",
                        example(VerdictEntry(0, "agreement", True),
                                VerdictEntry(0, "captured_split", False, "differs")))
    [entry] = read_log(log)
    assert [v.applied for v in entry.verdicts] == [None, None]
    assert [v.outcome for v in entry.verdicts] == ["unknown", "failed"]
    append(log, FindingEntry("r1", "reference", "sim", False, None, None, 1, 0.1, None))
    files = build_report([log], tmp_path / "out", maps=False)
    document = json.loads(files.verdicts.read_text())
    assert [v["outcome"] for v in document["verdicts"]] == ["unknown", "failed"]
    assert {c["checker"]: (c["held"], c["unknown"]) for c in document["coverage"]} == {
        "agreement": (0, 1), "captured_split": (0, 0)}
    skipped = ET.parse(files.junit).getroot().find(
        "testsuite/testcase[@name='examples[reference].agreement']/skipped")
    assert skipped.get("message") == (
        "not known to apply in any of the 1 examples (1 verdicts unknown: their log predates "
        "`applied`, so held or not applicable)")
    assert "| agreement | 0 | 0 | 0 | 0 | 1 |" in files.markdown.read_text()


def test_the_report_counts_each_checkers_coverage_in_json_markdown_and_its_output(tmp_path):
    judged = example(VerdictEntry(0, "agreement", True, applied=True),
                     VerdictEntry(0, "captured_split", True, "no rank replayed", applied=False))
    log = tmp_path / "log.jsonl"
    for entry in (judged, judged, FindingEntry("r1", "reference", "sim", False, None, None, 2,
                                               0.2, None)):
        append(log, entry)
    files = build_report([log], tmp_path / "out", maps=False)
    coverage = json.loads(files.verdicts.read_text())["coverage"]
    assert coverage == [
        {"checker": "agreement", "judged": 2, "held": 2, "failed": 0, "not_applicable": 0,
         "unknown": 0},
        {"checker": "captured_split", "judged": 0, "held": 0, "failed": 0,
         "not_applicable": 2, "unknown": 0}]
    text = files.markdown.read_text()
    assert "| captured_split | 0 | 0 | 0 | 2 |" in text and "unknown" not in text
    skipped = ET.parse(files.junit).getroot().find(".//skipped")
    assert skipped.get("message") == "not applicable in any of the 2 examples: no rank replayed"
