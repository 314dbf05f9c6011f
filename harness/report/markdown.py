"""The summary a person reads: the findings, the checkers examples failed, how to replay."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from harness.report.logs import Finding, RunLogs, step_tokens
from harness.report.outcome import finding_kind, finding_outcome, summary_line, variant_order


def summary_markdown(logs: RunLogs, maps: Sequence[str] = ()) -> str:
    """`maps` are the decision-map PNGs, as paths relative to the markdown file."""
    lines = ["# Fuzz report", "",
             summary_line((f.entry for f in logs.findings), len(logs.examples)), ""]
    lines += _findings_table(logs.findings)
    lines += _checker_table(logs)
    lines += _coverage_table(logs)
    lines += _replays(logs.findings)
    lines += ["## Decision maps", ""]
    lines += ([f"![decision map {m}]({m})" for m in maps] if maps else ["Not drawn."])
    return "\n".join(lines) + "\n"


def format_tokens(finding: Finding) -> str:
    """The shrunk scenario's per-rank tokens, step by step: `[32, 57] then [8, 8]`."""
    if finding.scenario is None:
        return "-"
    return " then ".join(str(step) for step in step_tokens(finding.scenario))


def _findings_table(findings: Sequence[Finding]) -> list[str]:
    lines = ["## Findings", ""]
    if not findings:
        return lines + ["No findings in the log (an interrupted run?).", ""]
    lines += ["| variant | world | verdict | checker | finding | examples | seconds | "
              "shrunk tokens |", "|---|---|---|---|---|---|---|---|"]
    order = {v: i for i, v in enumerate(variant_order(f.entry.variant for f in findings))}
    for finding in sorted(findings, key=lambda f: order[f.entry.variant]):
        e = finding.entry
        cells = [e.variant, e.world, finding_outcome(e), e.checker or "-",
                 finding_kind(e) or "-", str(e.examples), f"{e.seconds:.1f}",
                 format_tokens(finding)]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines + [""]


def _checker_table(logs: RunLogs) -> list[str]:
    lines = ["## Examples failing each checker", ""]
    per_checker: dict[str, Counter[str]] = {}
    for example in logs.examples:
        # An example counts once per checker, however many steps failed it.
        for checker in dict.fromkeys(v.checker for v in example.entry.failed):
            per_checker.setdefault(checker, Counter())[example.entry.variant] += 1
    if not per_checker:
        return lines + [f"No checker failed in {len(logs.examples)} examples.", ""]
    lines += ["| checker | examples failing | by variant |", "|---|---|---|"]
    for checker, counts in sorted(per_checker.items()):
        by_variant = ", ".join(f"{v} {counts[v]}" for v in variant_order(counts))
        lines.append(f"| {_cell(checker)} | {sum(counts.values())} | {_cell(by_variant)} |")
    return lines + [""]


def _coverage_table(logs: RunLogs) -> list[str]:
    lines = ["## Checker coverage", "",
             f"Verdicts per checker over the {len(logs.examples)} examples; n/a: nothing to "
             "judge, never counted as held.", ""]
    coverage = logs.coverage()
    if not coverage:
        return lines[:2] + ["No example in the log.", ""]
    unknown = any(c.unknown for c in coverage)
    lines += ["| checker | judged | held | failed | n/a |" + (" unknown |" if unknown else ""),
              "|---|---|---|---|---|" + ("---|" if unknown else "")]
    for c in coverage:
        cells = [c.checker, c.judged, c.held, c.failed, c.not_applicable,
                 *([c.unknown] if unknown else [])]
        lines.append("| " + " | ".join(_cell(str(x)) for x in cells) + " |")
    if unknown:
        lines += ["", "unknown: a passing verdict of a log written before verdicts said "
                  "whether they applied (held or not applicable, no one can tell)."]
    return lines + [""]


def _replays(findings: Sequence[Finding]) -> list[str]:
    lines = ["## Replay", ""]
    replayable = [f for f in findings if f.entry.replay]
    if not replayable:
        return lines + ["Nothing to replay.", ""]
    for finding in replayable:
        e = finding.entry
        lines += [f"{e.variant} ({e.world}, {finding_outcome(e)}, {e.checker}):", "",
                  "```sh", e.replay or "", "```", ""]
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
