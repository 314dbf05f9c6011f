"""`python -m harness report`: the run log as JUnit XML, verdict JSON, markdown and maps."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.check.coverage import coverage_lines
from harness.cli_config import output_dir
from harness.errors import ConfigError
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
    paths = args.log or [DEFAULT_LOG]
    seen: set[Path] = set()
    for path in paths:
        # The same log twice would count its examples and findings twice.
        if Path(path).resolve() in seen:
            raise ConfigError("log", f"{path} is given twice")
        seen.add(Path(path).resolve())
    out = output_dir("out", args.out)
    try:
        logs = load_logs(paths)
    except UnicodeDecodeError:
        raise ConfigError("log", f"{_undecodable(paths)} is not UTF-8 text") from None
    files = write_report(logs, out, maps=not args.no_maps)
    for path in files.all():
        print(path)
    findings = [f.entry for f in logs.findings]
    if logs.examples:
        print("\n".join(coverage_lines(logs.coverage(), f"{len(logs.examples)} examples")))
    print(summary_line(findings, len(logs.examples)))
    return 0 if all(finding_passes(f) for f in findings) else 1


def _undecodable(paths: list[str]) -> str:
    """The first log that is not UTF-8 (only looked for once reading one failed)."""
    for path in paths:
        try:
            Path(path).read_text()
        except UnicodeDecodeError:
            return path
    return " or ".join(paths)
