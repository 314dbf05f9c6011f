"""Read the run logs and write every report output into one directory."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.report.decision_map import draw_decision_maps
from harness.report.junit import junit_xml
from harness.report.logs import RunLogs, load_logs
from harness.report.markdown import summary_markdown
from harness.report.verdicts import verdicts_json


@dataclass(frozen=True)
class ReportFiles:
    junit: Path
    verdicts: Path
    markdown: Path
    maps: tuple[Path, ...]

    def all(self) -> tuple[Path, ...]:
        return (self.junit, self.verdicts, self.markdown, *self.maps)


def build_report(log_paths: Sequence[str | Path], out_dir: str | Path,
                 maps: bool = True) -> ReportFiles:
    return write_report(load_logs(log_paths), out_dir, maps)


def write_report(logs: RunLogs, out_dir: str | Path, maps: bool = True) -> ReportFiles:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Maps first: the markdown links the ones actually written.
    map_paths = draw_decision_maps(logs, out) if maps else ()
    files = ReportFiles(out / "junit.xml", out / "verdicts.json", out / "summary.md", map_paths)
    files.junit.write_text(junit_xml(logs))
    files.verdicts.write_text(verdicts_json(logs))
    files.markdown.write_text(summary_markdown(logs, [p.name for p in map_paths]))
    return files
