"""`python -m harness report`: the run log as JUnit XML, verdict JSON, markdown and maps."""

from __future__ import annotations

import argparse

from harness.fuzz.run_log import DEFAULT_LOG
from harness.report.build import write_report
from harness.report.logs import load_logs
from harness.report.outcome import finding_passes, summary_line


def add_report_command(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    report = sub.add_parser("report", help="turn fuzz run logs into JUnit XML, a verdict JSON, "
                            "a markdown summary and decision maps")
    report.add_argument("--log", action="append", metavar="FILE",
                        help=f"a run log (repeatable; default {DEFAULT_LOG})")
    report.add_argument("--out", default="report", metavar="DIR",
                        help="directory to write into (default report)")
    report.add_argument("--no-maps", action="store_true", help="skip the decision-map PNGs")
    report.set_defaults(func=cmd_report)
    return report


def cmd_report(args: argparse.Namespace) -> int:
    """0 when every finding passes, 1 otherwise; bad input raises ConfigError (exit 2)."""
    # `append` with a list default would add to the default, so it is filled in here.
    logs = load_logs(args.log or [DEFAULT_LOG])
    files = write_report(logs, args.out, maps=not args.no_maps)
    for path in files.all():
        print(path)
    findings = [f.entry for f in logs.findings]
    print(summary_line(findings, len(logs.examples)))
    return 0 if all(finding_passes(f) for f in findings) else 1
