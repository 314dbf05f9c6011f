"""A saved run: one scenario's whole history and the reference each step was judged by, as
one versioned JSON file, so that a new or fixed checker can judge the run again.

    {"format": "harness-history", "version": 1, "scenario": {...scenario wire form...},
     "timeouts": {...}, "startup": [record | null per rank],
     "steps": [[record | null per rank] per step that ran], "evidence": "...",
     "batched": false, "references": [reference per scenario step], "tested": {...}}

Records are read by their type hints (harness/history/codec.py). A file that is not this
format, or names another version, is one ConfigError naming the file and the field."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.check.reference import ReferenceRows
from harness.data_file import read_data_file
from harness.errors import ConfigError
from harness.history.codec import decode, encode
from harness.history.records import StartupRecord, StepRecord
from harness.history.scenario_history import ScenarioHistory
from harness.scenario import scenario_from_dict
from harness.timeouts import Timeouts

FORMAT = "harness-history"
VERSION = 1  # raise it when a record changes in a way an older reader would misread
FIELD = "history"  # the field every error about a saved run names

_STARTUP = tuple[StartupRecord | None, ...]
_STEPS = tuple[tuple[StepRecord | None, ...], ...]
_REFERENCES = tuple[ReferenceRows, ...]


@dataclass(frozen=True)
class Tested:
    """What `run` names above its verdicts: a note on its flags and the vLLM code tested, so
    a saved run prints the same without that vLLM at hand."""

    note: str = ""
    vllm: str = ""  # the line naming the vLLM code ('' for the harness's own decisions)
    vllm_json: Any = None  # the same, as `--json` prints it (None for the harness's own)


@dataclass(frozen=True)
class SavedRun:
    history: ScenarioHistory
    references: tuple[ReferenceRows, ...]  # one per scenario step, as the run judged them
    tested: Tested = Tested()


def run_to_dict(run: SavedRun) -> dict[str, Any]:
    history = run.history
    return {"format": FORMAT, "version": VERSION,
            "scenario": history.scenario.to_dict(),
            "timeouts": encode(history.timeouts, Timeouts),
            "startup": encode(history.startup, _STARTUP),
            "steps": encode(history.steps, _STEPS),
            "evidence": history.evidence, "batched": history.batched,
            "references": encode(run.references, _REFERENCES),
            "tested": encode(run.tested, Tested)}


_KEYS = ("format", "version", "scenario", "timeouts", "startup", "steps", "evidence",
         "batched", "references", "tested")


def run_from_dict(data: Any) -> SavedRun:
    """The saved run `run_to_dict` gave; a field that does not fit raises ConfigError."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError("format", f"is not {FORMAT!r}: this is not a saved run")
    if data.get("version") != VERSION:
        raise ConfigError("version", f"is {data.get('version')!r}; this harness reads "
                          f"version {VERSION}")
    unknown = sorted(set(data) - set(_KEYS))
    missing = [k for k in _KEYS if k not in data]
    if unknown or missing:
        raise ConfigError(unknown[0] if unknown else missing[0],
                          "is not a saved-run field" if unknown else "is missing")
    try:
        scenario = scenario_from_dict(data["scenario"])
    except ConfigError as exc:
        raise ConfigError(f"scenario.{exc.field}", exc.message) from None
    history = ScenarioHistory(
        scenario, decode(data["timeouts"], Timeouts, "timeouts"),
        decode(data["startup"], _STARTUP, "startup"), decode(data["steps"], _STEPS, "steps"),
        decode(data["evidence"], str, "evidence"), decode(data["batched"], bool, "batched"))
    run = SavedRun(history, decode(data["references"], _REFERENCES, "references"),
                   decode(data["tested"], Tested, "tested"))
    _check_shape(run)
    return run


def _check_shape(run: SavedRun) -> None:
    """Every rank has a slot in every phase, and each step that ran has its reference."""
    history, ranks = run.history, run.history.scenario.config.serving.dp_size
    planned = len(history.scenario.steps)
    if len(history.startup) != ranks:
        raise ConfigError("startup", f"has {len(history.startup)} records for {ranks} ranks")
    if len(history.steps) > planned:
        raise ConfigError("steps", f"has {len(history.steps)} steps; the scenario has {planned}")
    for i, records in enumerate(history.steps):
        if len(records) != ranks:
            raise ConfigError(f"steps[{i}]", f"has {len(records)} records for {ranks} ranks")
    if len(run.references) != planned:
        raise ConfigError("references", f"has {len(run.references)} for {planned} steps")


def save_run(path: str | Path, run: SavedRun) -> None:
    """Write the run to `path`, one JSON object (no NaN: non-finite floats are strings)."""
    text = json.dumps(run_to_dict(run), allow_nan=False, separators=(",", ":"))
    try:
        Path(path).write_text(text + "\n")
    except OSError as exc:
        raise ConfigError("save_history", f"cannot write {path}: {exc.strerror}") from None


def load_run(path: str | Path) -> SavedRun:
    """The run saved at `path`; anything else there is one ConfigError naming the file."""
    data = read_data_file(path, FIELD)
    try:
        return run_from_dict(data)
    except ConfigError as exc:
        raise ConfigError(FIELD, f"{path}: {exc.field} {exc.message}") from None


def check_writable(path: str | Path) -> None:
    """Refuse, before a run starts, a history file that could not be written after it."""
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise ConfigError("save_history", f"{path}: the folder {parent} does not exist")
    if Path(path).is_dir():
        raise ConfigError("save_history", f"{path} is a folder")
