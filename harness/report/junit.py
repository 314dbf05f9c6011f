"""JUnit XML for CI: one suite per variant, one test case per finding.

A finding fails by `finding_passes`: found on the reference, or a planted bug missed (not
found, or found as another checker than those that name it). An intermittent finding says so,
with how many of its runs failed. Each checker that failed an example gets a case too; it
fails only on the reference, where no checker may fail. A checker that applied to none of a
variant's examples is a skipped case giving why (its verdicts' reasons, most common first).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict

from harness.check.coverage import FAILED, HELD, NOT_APPLICABLE, UNKNOWN
from harness.fuzz.run_log import VerdictEntry
from harness.fuzz.variants import expects_a_finding, variant_named
from harness.report.logs import Example, Finding, RunLogs, step_tokens
from harness.report.outcome import (
    FOUND_ON_REFERENCE,
    MISSED,
    finding_outcome,
    finding_passes,
    variant_order,
)


def junit_xml(logs: RunLogs) -> str:
    root = junit_element(logs)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode")


def junit_element(logs: RunLogs) -> ET.Element:
    root = ET.Element("testsuites", name="dbo-harness fuzz")
    variants = variant_order([e.entry.variant for e in logs.examples]
                             + [f.entry.variant for f in logs.findings])
    for variant in variants:
        findings = [f for f in logs.findings if f.entry.variant == variant]
        examples = [e for e in logs.examples if e.entry.variant == variant]
        root.append(_suite(variant, findings, examples))
    _set_counts(root, root.findall("testsuite"))
    return root


def _suite(variant: str, findings: list[Finding], examples: list[Example]) -> ET.Element:
    suite = ET.Element("testsuite", name=f"fuzz.{variant}")
    props = ET.SubElement(suite, "properties")
    expected = "the planted bug found" if expects_a_finding(variant) else "nothing found"
    ET.SubElement(props, "property", name="expected", value=expected)
    several = len(findings) > 1
    for finding in findings:
        suite.append(_finding_case(finding, several))
    for checker, failing in sorted(_failing_by_checker(examples).items()):
        suite.append(_checker_case(variant, checker, failing))
    for checker, verdicts in _never_applied(examples).items():
        suite.append(_skipped_case(variant, checker, verdicts, len(examples)))
    _set_counts(suite, suite.findall("testcase"))
    return suite


def _finding_case(finding: Finding, several: bool) -> ET.Element:
    entry = finding.entry
    name = f"fuzz[{entry.variant}]" + (f" run {entry.run}" if several else "")
    case = ET.Element("testcase", classname=f"fuzz.{entry.world}", name=name,
                      time=f"{entry.seconds:.3f}")
    if entry.found:
        text = _found_text(finding)
        if finding_passes(entry):
            ET.SubElement(case, "system-out").text = text
        else:
            _found_failure(case, finding, text)
    elif not finding_passes(entry):
        failure = ET.SubElement(case, "failure", message="missed", type=finding_outcome(entry))
        failure.text = (f"no checker failed in {entry.examples} examples "
                        f"({entry.seconds:.1f} s); the planted bug went undetected")
    return case


def _found_failure(case: ET.Element, finding: Finding, text: str) -> None:
    """A failing finding: on the reference, or a planted bug found as another checker."""
    entry = finding.entry
    outcome = finding_outcome(entry)
    runs = entry.intermittency
    if outcome == FOUND_ON_REFERENCE:
        message = f"{entry.checker}, {runs.label}" if runs else entry.checker or "found"
        ET.SubElement(case, "failure", message=message, type=outcome).text = text
        return
    named = ", ".join(variant_named(entry.variant).caught_by)
    ET.SubElement(case, "failure", message=outcome, type=MISSED).text = (
        f"{outcome}: the planted bug is named by {named}; a finding by another checker is "
        f"a miss\n{text}")


def _found_text(finding: Finding) -> str:
    entry = finding.entry
    lines = [f"checker: {entry.checker}", f"examples: {entry.examples}"]
    if entry.intermittency is not None:
        runs = entry.intermittency
        lines.append(f"{runs.label}: {runs.detail} of its scenario; not shrunk")
    if finding.scenario is not None:
        lines.append(f"tokens per step per rank: {step_tokens(finding.scenario)}")
    if entry.replay:
        lines += ["", "replay:", f"  {entry.replay}"]
    if entry.blob:
        lines += ["", f"hypothesis blob: {entry.blob}"]
    if entry.scenario is not None:
        lines += ["", "scenario:", json.dumps(entry.scenario, indent=2)]
    return "\n".join(lines) + "\n"


def _failing_by_checker(examples: list[Example]) -> dict[str, list[Example]]:
    # An example counts once per checker, however many of its steps that checker failed.
    by_checker: dict[str, list[Example]] = defaultdict(list)
    for example in examples:
        for checker in dict.fromkeys(v.checker for v in example.entry.failed):
            by_checker[checker].append(example)
    return by_checker


def _checker_case(variant: str, checker: str, failing: list[Example]) -> ET.Element:
    case = ET.Element("testcase", classname=f"examples.{variant}",
                      name=f"examples[{variant}].{checker}", time="0.000")
    first = failing[0]
    detail = next(v.detail for v in first.entry.failed if v.checker == checker)
    text = (f"examples failing {checker}: {len(failing)}; the first, tokens "
            f"{step_tokens(first.scenario)}: {detail}\n")
    if not expects_a_finding(variant):
        failure = ET.SubElement(case, "failure", message=checker, type="example-failed")
        failure.text = text
    else:
        ET.SubElement(case, "system-out").text = text
    return case


def _never_applied(examples: list[Example]) -> dict[str, list[VerdictEntry]]:
    """Per checker that judged none of the examples (each example ran them all, applicable
    or not), its verdicts: shown as skipped, not as passed. A passing verdict of a log
    written before `applied` is unknown, so never counts as applied."""
    verdicts: dict[str, list[VerdictEntry]] = defaultdict(list)
    for example in examples:
        for v in example.entry.verdicts:
            verdicts[v.checker].append(v)
    return {checker: vs for checker, vs in verdicts.items()
            if not any(v.outcome in (HELD, FAILED) for v in vs)}


def _skipped_case(variant: str, checker: str, verdicts: list[VerdictEntry],
                  examples: int) -> ET.Element:
    case = ET.Element("testcase", classname=f"examples.{variant}",
                      name=f"examples[{variant}].{checker}", time="0.000")
    unknown = sum(v.outcome == UNKNOWN for v in verdicts)
    reasons = Counter(v.detail or "no reason given" for v in verdicts
                      if v.outcome == NOT_APPLICABLE)
    if reasons:
        reason, _ = reasons.most_common(1)[0]
        message = f"not applicable in any of the {examples} examples: {reason}"
    else:
        message = f"not known to apply in any of the {examples} examples"
    if unknown:
        message += (f" ({unknown} verdicts unknown: their log predates `applied`, so "
                    "held or not applicable)")
    skipped = ET.SubElement(case, "skipped", message=message)
    skipped.text = "".join(f"{count} x {reason}\n" for reason, count in reasons.most_common())
    return case


def _set_counts(element: ET.Element, children: list[ET.Element]) -> None:
    if element.tag == "testsuites":
        tests = sum(int(c.get("tests", "0")) for c in children)
        failures = sum(int(c.get("failures", "0")) for c in children)
        skipped = sum(int(c.get("skipped", "0")) for c in children)
    else:
        tests, failures = len(children), sum(c.find("failure") is not None for c in children)
        skipped = sum(c.find("skipped") is not None for c in children)
    seconds = sum(float(c.get("time", "0")) for c in children)
    element.set("tests", str(tests))
    element.set("failures", str(failures))
    element.set("errors", "0")
    element.set("skipped", str(skipped))
    element.set("time", f"{seconds:.3f}")
