"""Every verdict of every example as one JSON document, plus the findings.

    {"verdicts": [{"variant", "world", "run", "scenario_name", "tokens", "step", "phase",
                   "checker", "ok", "outcome", "detail"}],
     "findings": [{"variant", "world", "run", "outcome", "passes", "found", "checker",
                   "kind", "failed_runs", "runs", "scenario_name", "tokens", "examples",
                   "seconds", "replay", "blob", "scenario"}],
     "coverage": [{"checker", "judged", "held", "failed", "not_applicable", "unknown"}]}

`tokens` is per step, per rank token counts; `phase` is "start-up" (capture), "step" (`step`
its index) or "scenario" (once over every step; `step` null for it and for start-up);
`outcome` is "held", "failed", "not applicable" or, for a passing verdict of a log written
before verdicts said whether they applied, "unknown" (`ok` is true for all but "failed").
`coverage` counts each checker's verdicts over every example; `judged` is held + failed.
A finding's `outcome` is "pass", "MISSED", "found as CHECKER" (a planted bug shown by a
checker that does not name it) or "FOUND-ON-REFERENCE"; its `kind` null (nothing found),
"reproducible" or "intermittent (r/N)" (failed r of its N runs; `failed_runs`, `runs`).
"""

from __future__ import annotations

import json
from typing import Any

from harness.report.logs import Example, Finding, RunLogs, step_tokens
from harness.report.outcome import finding_kind, finding_outcome, finding_passes


def verdicts_json(logs: RunLogs) -> str:
    """The document with one verdict or finding per line: greppable, and diffs stay small."""
    document = verdicts_document(logs)
    parts = []
    for key, rows in document.items():
        body = ",\n".join(f"  {json.dumps(row)}" for row in rows)
        parts.append(f" {json.dumps(key)}: [\n{body}\n ]" if rows else f" {json.dumps(key)}: []")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def verdicts_document(logs: RunLogs) -> dict[str, Any]:
    return {"verdicts": [row for e in logs.examples for row in verdict_rows(e)],
            "findings": [finding_row(f) for f in logs.findings],
            "coverage": [c.to_dict() for c in logs.coverage()]}


def verdict_rows(example: Example) -> list[dict[str, Any]]:
    entry = example.entry
    tokens = step_tokens(example.scenario)
    return [{"variant": entry.variant, "world": entry.world, "run": entry.run,
             "scenario_name": example.scenario.name, "tokens": tokens, "step": v.step,
             "phase": v.phase_name, "checker": v.checker, "ok": v.ok, "outcome": v.outcome,
             "detail": v.detail}
            for v in entry.verdicts]


def finding_row(finding: Finding) -> dict[str, Any]:
    entry = finding.entry
    scenario = finding.scenario
    return {"variant": entry.variant, "world": entry.world, "run": entry.run,
            "outcome": finding_outcome(entry), "passes": finding_passes(entry),
            "found": entry.found, "checker": entry.checker, "kind": finding_kind(entry),
            "failed_runs": entry.failed_runs, "runs": entry.runs,
            "scenario_name": None if scenario is None else scenario.name,
            "tokens": None if scenario is None else step_tokens(scenario),
            "examples": entry.examples, "seconds": entry.seconds, "replay": entry.replay,
            "blob": entry.blob, "scenario": entry.scenario}
