"""A planted bug counts as found only as itself (harness/fuzz/variants.py `detection`): by a
checker the variant names. A finding by another checker is a miss, shown as "found as X", in
the fuzz table and its exit code and in a campaign's; the reference fails on any finding.
No world runs: the outcomes are built by hand."""

from __future__ import annotations

from pathlib import Path

from harness.fuzz.command import fuzz_exit, print_table
from harness.fuzz.jobs import JobResult, campaign_exit, report_jobs
from harness.fuzz.result import FuzzOutcome
from harness.fuzz.run_log import Intermittency
from harness.fuzz.variants import detection, did_its_job


def outcome(variant: str, found: bool, checker: str | None = None,
            runs: Intermittency | None = None) -> FuzzOutcome:
    return FuzzOutcome(variant, "sim", found, checker, "", None, 10, 1.0,
                       3 if found else None, 0.5 if found else None, None, None,
                       intermittency=runs)


def test_a_bug_is_found_only_by_a_checker_that_names_it():
    assert detection(("no_empty_region", "captured_split"), True, "captured_split") == "found"
    assert detection(("no_empty_region",), True, "errors") == "found as errors"
    assert detection(("no_empty_region",), False, None) == "not found"
    assert did_its_job("guard-merged", True, "no_empty_region")
    assert not did_its_job("guard-merged", True, "graphs_reachable")
    assert not did_its_job("guard-merged", False, None)
    assert did_its_job("reference", False, None)
    assert not did_its_job("reference", True, "matches_reference")


def table_rows(capsys) -> dict[str, list[str]]:
    lines = capsys.readouterr().out.strip().splitlines()
    return {line.split()[0]: line.split() for line in lines[1:]}


def test_the_fuzz_table_shows_a_bug_found_by_another_checker_as_found_as_it_and_exits_1(
        capsys):
    outcomes = [outcome("reference", False), outcome("guard-merged", True, "no_empty_region"),
                outcome("guard-strict-k2", True, "graphs_reachable")]
    print_table(outcomes)
    rows = table_rows(capsys)
    assert rows["guard-merged"][1:3] == ["ok", "no_empty_region"]
    assert rows["guard-strict-k2"][1:4] == ["found", "as", "graphs_reachable"]
    assert fuzz_exit(outcomes, several=True) == 1
    assert fuzz_exit(outcomes[:2], several=True) == 0


def test_an_intermittent_failure_on_the_reference_fails_the_table_with_its_counts(capsys):
    outcomes = [outcome("reference", True, "liveness", Intermittency(2, 5)),
                outcome("guard-merged", True, "no_empty_region")]
    print_table(outcomes)
    rows = table_rows(capsys)
    assert rows["reference"][1:5] == ["FALSE", "liveness", "intermittent", "(2/5)"]
    assert rows["guard-merged"][3] == "reproducible"
    assert fuzz_exit(outcomes, several=True) == 1
    assert fuzz_exit(outcomes[:1], several=False) == 1


def job(outcomes: list[FuzzOutcome]) -> JobResult:
    return JobResult(1, 7, 1, tuple(o.to_json_dict() for o in outcomes), Path("job.jsonl"), "",
                     Path("job.err"), ())


def test_a_campaign_counts_a_bug_found_as_another_checker_as_missed(capsys):
    variants = ["reference", "guard-merged"]
    elsewhere = job([outcome("reference", False), outcome("guard-merged", True, "errors")])
    itself = job([outcome("reference", False), outcome("guard-merged", True,
                                                       "captured_split")])
    assert campaign_exit([itself], variants) == 0
    assert report_jobs([elsewhere], variants, "db", as_json=False) == 1
    row = next(line for line in capsys.readouterr().out.splitlines() if "guard-merged" in line)
    assert "found as errors" in row


def test_one_search_per_failure_class_exits_1_when_any_of_them_found_something():
    # The plain search under vLLM's execution: a hang search that held, a crash search that
    # found its crash; neither is a self-check that expects each to find.
    held = outcome("vllm-exec-hang", False)
    crashed = outcome("vllm-exec-crash", True, "errors")
    assert fuzz_exit([held, crashed], several=False) == 1
    assert fuzz_exit([held, held], several=False) == 0
