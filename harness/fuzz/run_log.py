"""The run log: one JSON object per line, one per example judged and one per finding.

The fuzzer appends to it; `python -m harness report` reads it back. Plain dicts on disk so
that a log written by an older version still reads.

    {"type": "example", "run": ..., "variant": ..., "world": ..., "scenario": {...},
     "ok": bool, "verdicts": [{"step": null | i, "checker": ..., "ok": bool, "detail": ...,
                               "applied": bool, "phase": "start-up" | "step" | "scenario"}],
     "seconds": float}
    {"type": "finding", "run": ..., "variant": ..., "world": ..., "found": bool,
     "checker": ... | null, "scenario": {...} | null, "examples": int, "seconds": float,
     "replay": ... | null, "blob": ... | null, "found_by": "replay" | "search" | null,
     "replayed": int, "failed_runs": int | null, "runs": int | null}

`failed_runs` of `runs` are set on an intermittent finding: a failure that passed its rerun.
A verdict without `applied` (a log written before it) that passed reads as "unknown": held
or not applicable, no one can tell.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.check.coverage import FAILED, HELD, NOT_APPLICABLE, UNKNOWN
from harness.check.judge import ScenarioResult
from harness.errors import ConfigError
from harness.scenario import Scenario

DEFAULT_LOG = ".harness/fuzz-log.jsonl"


@dataclass(frozen=True)
class VerdictEntry:
    step: int | None  # None: a start-up (capture) verdict
    checker: str
    ok: bool
    detail: str = ""
    # False: "not applicable"; None in logs written before this field: a passing verdict
    # there is unknown (held or not applicable), never read as held.
    applied: bool | None = None
    # "start-up", "step" or "scenario"; None in logs written before this field (told by step)
    phase: str | None = None

    @property
    def outcome(self) -> str:
        """held, failed, not applicable, or unknown (a passing verdict of an older log)."""
        if not self.ok:
            return FAILED
        return UNKNOWN if self.applied is None else HELD if self.applied else NOT_APPLICABLE

    @property
    def phase_name(self) -> str:
        return self.phase or ("start-up" if self.step is None else "step")


@dataclass(frozen=True)
class ExampleEntry:
    run: str
    variant: str
    world: str
    scenario: dict[str, Any]
    ok: bool
    verdicts: tuple[VerdictEntry, ...]
    seconds: float

    @property
    def failed(self) -> tuple[VerdictEntry, ...]:
        return tuple(v for v in self.verdicts if not v.ok)


@dataclass(frozen=True)
class Intermittency:
    """A failure that passed on its rerun: how many of the runs of its scenario failed."""

    failed: int
    runs: int

    @property
    def label(self) -> str:
        return f"intermittent ({self.failed}/{self.runs})"

    @property
    def detail(self) -> str:
        return f"failed {self.failed} of {self.runs} runs"


@dataclass(frozen=True)
class FindingEntry:
    run: str
    variant: str
    world: str
    found: bool
    checker: str | None
    scenario: dict[str, Any] | None
    examples: int
    seconds: float
    replay: str | None
    blob: str | None = None
    found_by: str | None = None  # "replay" (a failure saved in the database) or "search"
    replayed: int = 0  # saved failures the search replayed before drawing its own
    failed_runs: int | None = None  # set, with `runs`, on an intermittent finding
    runs: int | None = None

    @property
    def intermittency(self) -> Intermittency | None:
        if self.failed_runs is None or self.runs is None:
            return None
        return Intermittency(self.failed_runs, self.runs)


Entry = ExampleEntry | FindingEntry


def example_entry(run_id: str, variant: str, world: str, scenario: Scenario,
                  result: ScenarioResult, seconds: float) -> ExampleEntry:
    """One judged example: every verdict, by phase."""
    verdicts = [VerdictEntry(None, v.checker, v.ok, v.detail, v.applied, "start-up")
                for v in result.startup_verdicts]
    verdicts += [VerdictEntry(i, v.checker, v.ok, v.detail, v.applied, "step")
                 for i, step in enumerate(result.steps) for v in step.verdicts]
    verdicts += [VerdictEntry(None, v.checker, v.ok, v.detail, v.applied, "scenario")
                 for v in result.scenario_verdicts]
    return ExampleEntry(run_id, variant, world, scenario.to_dict(), result.ok, tuple(verdicts),
                        round(seconds, 4))


def entry_to_dict(entry: Entry) -> dict[str, Any]:
    kind = "example" if isinstance(entry, ExampleEntry) else "finding"
    return {"type": kind, **asdict(entry)}


def append(path: str | Path, entry: Entry) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(entry_to_dict(entry)) + "\n")


def read_log(path: str | Path) -> Iterator[Entry]:
    """Every entry of a log; a malformed line is a ConfigError naming the file and line."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError("log", f"cannot read {path}: {exc.strerror}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield _entry_from_dict(json.loads(line))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ConfigError("log", f"{path}:{number} is not a run-log entry ({exc})") from None


def _entry_from_dict(data: dict[str, Any]) -> Entry:
    kind = data.pop("type")
    if kind == "example":
        data["verdicts"] = tuple(VerdictEntry(**v) for v in data["verdicts"])
        return ExampleEntry(**data)
    if kind == "finding":
        return FindingEntry(**data)
    raise ValueError(f"unknown entry type {kind!r}")
