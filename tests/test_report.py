"""The report of a fuzz run: JUnit XML, verdict JSON, markdown and decision maps, from a log."""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest

from harness.config import HarnessConfig
from harness.errors import ConfigError
from harness.fuzz.run_log import ExampleEntry, FindingEntry, VerdictEntry, append
from harness.report.build import build_report
from harness.report.command import add_report_command
from harness.report.decision_map import (
    cell_batches,
    config_key,
    decision_grid,
    decision_maps,
    guard_boundaries,
)
from harness.report.logs import load_logs
from harness.report.outcome import finding_outcome, finding_passes
from harness.scenario import scenario_from_dict
from harness.sut.step_plan import plan_without_world

CONFIG = {"capture_sizes": [16, 32, 64], "max_num_reqs": 64, "max_num_batched_tokens": 64,
          "decode_threshold": 8, "prefill_threshold": 32}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def scenario(*steps: list[int], **config) -> dict:
    data = {"config": {**CONFIG, **config}, "steps": [{"ranks": list(s)} for s in steps]}
    return scenario_from_dict(data).to_dict()


def example(variant: str, tokens: list[int], failing: str | None = None,
            unjudged: str | None = None, **config) -> ExampleEntry:
    verdicts = [VerdictEntry(None, "startup", True, applied=True),
                VerdictEntry(0, "agreement", True, applied=True),
                VerdictEntry(0, "no_empty_region", failing != "no_empty_region",
                             "rank 0 replays with empty region(s) [1]", applied=True)]
    if failing and failing != "no_empty_region":
        verdicts.append(VerdictEntry(0, failing, False, "differs", applied=True))
    if unjudged:
        verdicts.append(VerdictEntry(0, unjudged, True, "no rank replayed", applied=False))
    return ExampleEntry("r1", variant, "sim", scenario(tokens, **config), failing is None,
                        tuple(verdicts), 0.25)


def finding(variant: str, found: bool, tokens: list[int] | None = None,
            checker: str = "no_empty_region", **config) -> FindingEntry:
    if not found:
        return FindingEntry("r1", variant, "sim", False, None, None, 40, 3.5, None)
    return FindingEntry("r1", variant, "sim", True, checker, scenario(tokens, **config), 12,
                        1.25, f"python -m harness fuzz --variant {variant} --replay X", "AXiD")


def write_log(path: Path, *entries) -> Path:
    for entry in entries:
        append(path, entry)
    return path


@pytest.fixture
def mixed_log(tmp_path) -> Path:
    """The reference found a bug (a real failure), merged was found, strict-k2 missed."""
    return write_log(
        tmp_path / "log.jsonl",
        example("reference", [16, 40]),
        example("reference", [32, 57], failing="matches_reference"),
        finding("reference", True, [32, 57], checker="matches_reference"),
        example("guard-merged", [32, 57], failing="no_empty_region", guard="merged"),
        example("guard-merged", [33, 64], guard="merged"),
        finding("guard-merged", True, [32, 64], guard="merged"),
        example("guard-strict-k2", [40, 40], guard="strict-k2"),
        finding("guard-strict-k2", False),
    )


def test_a_found_bug_passes_and_a_found_reference_or_a_missed_bug_fails():
    assert finding_passes(finding("guard-merged", True, [32, 64], guard="merged"))
    assert finding_passes(finding("reference", False))
    assert not finding_passes(finding("reference", True, [32, 57]))
    assert not finding_passes(finding("guard-merged", False))
    assert finding_outcome(finding("reference", True, [32, 57])) == "FOUND-ON-REFERENCE"
    assert finding_outcome(finding("guard-merged", False)) == "MISSED"


def test_a_planted_bug_found_by_a_checker_that_does_not_name_it_is_a_miss_found_as_that():
    # guard-merged is named by no_empty_region and captured_split.
    elsewhere = finding("guard-merged", True, [32, 64], checker="graphs_reachable",
                        guard="merged")
    assert not finding_passes(elsewhere)
    assert finding_outcome(elsewhere) == "found as graphs_reachable"
    assert finding_passes(finding("guard-merged", True, [32, 64], checker="captured_split",
                                  guard="merged"))


def test_a_bug_found_as_another_checker_fails_junit_and_reads_found_as_in_every_output(
        tmp_path, capsys):
    log = write_log(tmp_path / "log.jsonl",
                    finding("guard-merged", True, [32, 64], checker="graphs_reachable",
                            guard="merged"))
    files = build_report([log], tmp_path / "out", maps=False)
    failure = ET.parse(files.junit).getroot().find(
        "testsuite/testcase[@name='fuzz[guard-merged]']/failure")
    assert failure.get("message") == "found as graphs_reachable"
    assert failure.get("type") == "MISSED"
    assert "named by no_empty_region, captured_split" in failure.text
    [row] = json.loads(files.verdicts.read_text())["findings"]
    assert (row["outcome"], row["passes"]) == ("found as graphs_reachable", False)
    text = files.markdown.read_text()
    assert "| found as graphs_reachable | graphs_reachable |" in text
    assert "1 findings: 0 pass, 1 missed (1 found as another checker)" in text
    assert run_command("--log", str(log), "--out", str(tmp_path / "out2"), "--no-maps") == 1


def intermittent(variant: str, tokens: list[int], checker: str, **config) -> FindingEntry:
    return replace(finding(variant, True, tokens, checker=checker, **config), failed_runs=1,
                   runs=5)


def test_an_intermittent_finding_on_the_reference_fails_and_says_how_often_it_failed(
        tmp_path):
    log = write_log(tmp_path / "log.jsonl", intermittent("reference", [32, 57], "liveness"))
    [read] = [f.entry for f in load_logs([log]).findings]
    assert (read.failed_runs, read.runs) == (1, 5)  # the counts survive the log
    files = build_report([log], tmp_path / "out", maps=False)
    failure = ET.parse(files.junit).getroot().find(
        "testsuite/testcase[@name='fuzz[reference]']/failure")
    assert failure.get("message") == "liveness, intermittent (1/5)"
    assert failure.get("type") == "FOUND-ON-REFERENCE"
    assert "intermittent (1/5): failed 1 of 5 runs" in failure.text
    [row] = json.loads(files.verdicts.read_text())["findings"]
    assert (row["kind"], row["failed_runs"], row["runs"], row["passes"]) == (
        "intermittent (1/5)", 1, 5, False)
    text = files.markdown.read_text()
    assert "| FOUND-ON-REFERENCE | liveness | intermittent (1/5) |" in text
    assert "1 found on the reference, 1 intermittent" in text
    assert run_command("--log", str(log), "--out", str(tmp_path / "out2"), "--no-maps") == 1


def test_a_finding_on_the_reference_fails_the_junit_report(mixed_log, tmp_path):
    files = build_report([mixed_log], tmp_path / "out", maps=False)
    root = ET.parse(files.junit).getroot()
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert list(suites) == ["fuzz.reference", "fuzz.guard-merged", "fuzz.guard-strict-k2"]
    reference = suites["fuzz.reference"]
    found = reference.find("testcase[@name='fuzz[reference]']")
    failure = found.find("failure")
    assert failure.get("message") == "matches_reference"
    assert "python -m harness fuzz --variant reference" in failure.text
    assert json.loads(failure.text.split("scenario:\n", 1)[1])["steps"][0]["ranks"] == [
        {"tokens": 32}, {"tokens": 57}]
    assert found.get("time") == "1.250"
    # The reference's finding and the example checker it failed; merged's found bug passes.
    assert (reference.get("tests"), reference.get("failures")) == ("2", "2")
    merged = suites["fuzz.guard-merged"]
    assert (merged.get("tests"), merged.get("failures")) == ("2", "0")
    assert "replay" in merged.find("testcase[@name='fuzz[guard-merged]']/system-out").text
    missed = suites["fuzz.guard-strict-k2"].find("testcase/failure")
    assert missed.get("message") == "missed" and "40 examples" in missed.text
    assert (root.get("tests"), root.get("failures")) == ("5", "3")


def test_a_log_where_every_finding_passes_has_no_junit_failure(tmp_path):
    log = write_log(tmp_path / "log.jsonl", example("reference", [16, 40]),
                    finding("reference", False),
                    example("guard-merged", [32, 57], failing="no_empty_region", guard="merged"),
                    finding("guard-merged", True, [32, 64], guard="merged"))
    root = ET.parse(build_report([log], tmp_path / "out", maps=False).junit).getroot()
    assert root.get("failures") == "0" and root.get("tests") == "3"
    assert root.find(".//failure") is None


def test_the_verdict_json_holds_every_verdict_of_every_example(mixed_log, tmp_path):
    files = build_report([mixed_log], tmp_path / "out", maps=False)
    document = json.loads(files.verdicts.read_text())
    logs = load_logs([mixed_log])
    assert len(document["verdicts"]) == sum(len(e.entry.verdicts) for e in logs.examples) == 16
    failed = [v for v in document["verdicts"] if not v["ok"]]
    assert {(v["variant"], v["checker"], tuple(v["tokens"][0])) for v in failed} == {
        ("reference", "matches_reference", (32, 57)),
        ("guard-merged", "no_empty_region", (32, 57))}
    startup = document["verdicts"][0]
    assert startup["step"] is None and startup["checker"] == "startup"
    assert set(startup) == {"variant", "world", "run", "scenario_name", "tokens", "step",
                            "phase", "checker", "ok", "outcome", "detail"}
    assert startup["phase"] == "start-up" and document["verdicts"][1]["phase"] == "step"
    assert {v["outcome"] for v in failed} == {"failed"} and startup["outcome"] == "held"
    outcomes = {f["variant"]: (f["outcome"], f["passes"], f["tokens"])
                for f in document["findings"]}
    assert outcomes == {"reference": ("FOUND-ON-REFERENCE", False, [[32, 57]]),
                        "guard-merged": ("pass", True, [[32, 64]]),
                        "guard-strict-k2": ("MISSED", False, None)}


def test_a_scenario_verdict_is_a_row_of_its_phase_in_json_and_a_failing_case_in_junit(
        tmp_path):
    cut = example("reference", [16, 40])
    whole = VerdictEntry(None, "steps_complete", False, "only 1 of 2 steps ran", phase="scenario")
    cut = replace(cut, ok=False, verdicts=(*cut.verdicts, whole))
    files = build_report([write_log(tmp_path / "log.jsonl", cut, finding("reference", False))],
                         tmp_path / "out", maps=False)
    [row] = [v for v in json.loads(files.verdicts.read_text())["verdicts"]
             if v["checker"] == "steps_complete"]
    assert (row["phase"], row["step"], row["outcome"]) == ("scenario", None, "failed")
    root = ET.parse(files.junit).getroot()
    case = root.find("testsuite/testcase[@name='examples[reference].steps_complete']")
    assert "only 1 of 2 steps ran" in case.find("failure").text


def test_a_checker_that_judged_no_example_is_not_applicable_in_json_and_skipped_in_junit(
        tmp_path):
    log = write_log(tmp_path / "log.jsonl",
                    example("reference", [16, 40], unjudged="captured_split"),
                    example("reference", [8, 8], unjudged="captured_split"),
                    finding("reference", False))
    files = build_report([log], tmp_path / "out", maps=False)
    rows = json.loads(files.verdicts.read_text())["verdicts"]
    unjudged = [v for v in rows if v["checker"] == "captured_split"]
    assert [(v["ok"], v["outcome"]) for v in unjudged] == [(True, "not applicable")] * 2
    root = ET.parse(files.junit).getroot()
    case = root.find("testsuite/testcase[@name='examples[reference].captured_split']")
    assert case.find("skipped").get("message") == (
        "not applicable in any of the 2 examples: no rank replayed")
    assert case.find("skipped").text == "2 x no rank replayed\n"
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("2", "0", "1")
    # A checker that judged one of the examples is no skipped case.
    judged = example("reference", [8, 8])
    judged = replace(judged, verdicts=(*judged.verdicts,
                                       VerdictEntry(0, "captured_split", True, applied=True)))
    log2 = write_log(tmp_path / "log2.jsonl",
                     example("reference", [16, 40], unjudged="captured_split"), judged,
                     finding("reference", False))
    root2 = ET.parse(build_report([log2], tmp_path / "out2", maps=False).junit).getroot()
    assert root2.find(".//skipped") is None


def test_the_markdown_names_missed_variants_and_how_to_replay_the_findings(mixed_log, tmp_path):
    text = build_report([mixed_log], tmp_path / "out", maps=False).markdown.read_text()
    rows = {line.split("|")[1].strip(): line for line in text.splitlines()
            if line.startswith("| ") and "| sim |" in line}
    assert "| MISSED |" in rows["guard-strict-k2"]
    assert "| FOUND-ON-REFERENCE |" in rows["reference"] and "[32, 57]" in rows["reference"]
    assert "| pass |" in rows["guard-merged"] and "[32, 64]" in rows["guard-merged"]
    assert "| no_empty_region | 1 | guard-merged 1 |" in text
    assert "| matches_reference | 1 | reference 1 |" in text
    assert "```sh\npython -m harness fuzz --variant guard-merged --replay X\n```" in text
    assert "1 pass, 1 missed, 1 found on the reference; 5 examples" in text


def test_a_decision_map_png_is_written_per_config_and_linked_from_the_markdown(mixed_log,
                                                                               tmp_path):
    files = build_report([mixed_log], tmp_path / "out")
    configs = {config_key(HarnessConfig.of(**CONFIG, guard=g))
               for g in ("fixed", "merged", "strict-k2")}
    assert {p.name for p in files.maps} == {f"decision-map-{k}.png" for k in configs}
    for path in files.maps:
        data = path.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 1000
        assert f"]({path.name})" in files.markdown.read_text()


def test_a_map_marks_failing_examples_and_findings_of_its_own_config_only(mixed_log):
    maps = {m.config.mutation.guard.value: m for m in decision_maps(load_logs([mixed_log]))}
    assert maps["merged"].failing == ((32, 57),)
    assert maps["merged"].findings == ((32, 64, "no_empty_region"),)
    assert maps["merged"].variants == ("guard-merged",)
    assert maps["fixed"].failing == ((32, 57),) and maps["strict-k2"].failing == ()


@pytest.mark.parametrize("guard", ["fixed", "merged"])
def test_the_map_draws_the_decision_layers_own_plans(guard):
    config = HarnessConfig.of(**CONFIG, guard=guard)
    grid = decision_grid(config, 64)
    for low, high in ((0, 0), (0, 64), (7, 64), (8, 16), (31, 64), (32, 64), (33, 64),
                      (20, 20), (64, 64)):
        plans = plan_without_world(config, cell_batches(config, low, high))
        assert grid[high][low] == plans[0].kind
    assert grid[0][1] is None  # the minimum cannot exceed the maximum


def test_half_the_graph_is_full_microbatched_only_under_the_merged_guard():
    # k = 2, G = 64: the last region starts at 32, so a rank holding 32 tokens fills only one.
    fixed = decision_grid(HarnessConfig.of(**CONFIG), 64)
    merged = decision_grid(HarnessConfig.of(**CONFIG, guard="merged"), 64)
    assert fixed[64][32] == "eager-microbatched" and merged[64][32] == "full-microbatched"
    assert fixed[64][33] == merged[64][33] == "full-microbatched"
    assert fixed[64][4] == "full"  # below the decode threshold: not microbatched at all
    assert fixed[64][0] == "full"  # an idle rank's dummy batch votes FULL: all replay 64


def test_the_guard_boundary_sits_at_the_last_region_start_of_each_microbatched_graph():
    bounds = guard_boundaries(HarnessConfig.of(**CONFIG), 64)
    assert [(b.graph_tokens, b.min_tokens, b.max_low, b.max_high) for b in bounds] == [
        (16, 8, 1, 16), (32, 16, 17, 32), (64, 32, 33, 64)]
    three = HarnessConfig.of(**{**CONFIG, "capture_sizes": [24, 48]}, enable_dbo=False,
                             ubatch_size=3)
    assert [(b.graph_tokens, b.min_tokens) for b in guard_boundaries(three, 64)] == [
        (24, 16), (48, 32)]


def run_command(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_report_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["report", *argv])
    return args.func(args)


def test_the_command_exits_1_when_a_finding_fails_and_0_when_every_one_passes(
        mixed_log, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_command("--log", str(mixed_log), "--out", str(out), "--no-maps") == 1
    printed = capsys.readouterr().out.splitlines()
    assert printed[:3] == [str(out / "junit.xml"), str(out / "verdicts.json"),
                           str(out / "summary.md")]
    assert printed[-1].startswith("3 findings: 1 pass, 1 missed")
    good = write_log(tmp_path / "good.jsonl", finding("guard-merged", True, [32, 64],
                                                      guard="merged"))
    clean = write_log(tmp_path / "clean.jsonl", finding("reference", False))
    assert run_command("--log", str(good), "--log", str(clean), "--out", str(out),
                       "--no-maps") == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("2 findings: 2 pass")


@pytest.mark.parametrize("content, complaint", [
    (None, "cannot read"),
    ("", "holds no entries"),
    ("{not json\n", "entry"),
    ('"a string"\n', "not a run-log entry"),
    ('{"type": "finding", "run": "r", "variant": "v", "world": "sim", "found": "yes", '
     '"checker": null, "scenario": null, "examples": 1, "seconds": 1.0, "replay": null}\n',
     "`found` is 'yes'"),
    ('{"type": "finding", "run": "r", "variant": "v", "world": "sim", "found": true, '
     '"checker": "c", "scenario": {"steps": []}, "examples": 1, "seconds": 1.0, '
     '"replay": null}\n', "scenario does not load"),
])
def test_a_missing_empty_or_malformed_log_is_bad_input(tmp_path, content, complaint):
    log = tmp_path / "log.jsonl"
    if content is not None:
        log.write_text(content)
    with pytest.raises(ConfigError, match=complaint) as caught:
        run_command("--log", str(log), "--out", str(tmp_path / "out"), "--no-maps")
    assert caught.value.field == "log"
    assert not (tmp_path / "out").exists()  # nothing is written from bad input
