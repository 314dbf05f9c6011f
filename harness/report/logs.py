"""The run logs a report reads, with every scenario parsed once.

Anything a report cannot use (a missing or empty log, a malformed line, a field of the wrong
type, a scenario that does not load) is a ConfigError naming the log and the entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.check.coverage import CheckerCoverage, coverage_of
from harness.errors import ConfigError
from harness.fuzz.run_log import ExampleEntry, FindingEntry, read_log
from harness.scenario import Scenario, scenario_from_dict


@dataclass(frozen=True)
class Example:
    entry: ExampleEntry
    scenario: Scenario


@dataclass(frozen=True)
class Finding:
    entry: FindingEntry
    scenario: Scenario | None  # the shrunk scenario; None when nothing was found


@dataclass(frozen=True)
class RunLogs:
    examples: tuple[Example, ...]
    findings: tuple[Finding, ...]

    def coverage(self, variant: str | None = None) -> tuple[CheckerCoverage, ...]:
        """Each checker's verdicts over every example (of `variant`, when named)."""
        return coverage_of((v.checker, v.outcome) for e in self.examples
                           if variant is None or e.entry.variant == variant
                           for v in e.entry.verdicts)


def step_tokens(scenario: Scenario) -> list[list[int]]:
    """Per step, each rank's scheduled token count."""
    return [[b.num_tokens for b in scenario.batches(step)] for step in range(len(scenario.steps))]


def load_logs(paths: Sequence[str | Path]) -> RunLogs:
    if not paths:
        raise ConfigError("log", "no run log given")
    examples: list[Example] = []
    findings: list[Finding] = []
    for path in paths:
        count = 0
        for count, entry in enumerate(_entries(Path(path)), 1):
            where = f"{path} entry {count}"
            if isinstance(entry, ExampleEntry):
                _check_fields(entry, _EXAMPLE_FIELDS, where)
                for verdict in entry.verdicts:
                    _check_fields(verdict, _VERDICT_FIELDS, where)
                examples.append(Example(entry, _scenario(entry.scenario, where)))
            else:
                _check_fields(entry, _FINDING_FIELDS, where)
                scenario = None if entry.scenario is None else _scenario(entry.scenario, where)
                findings.append(Finding(entry, scenario))
        if count == 0:
            raise ConfigError("log", f"{path} holds no entries (did the fuzzer run?)")
    return RunLogs(tuple(examples), tuple(findings))


def _entries(path: Path):
    try:
        yield from read_log(path)
    except AttributeError:
        # read_log catches a bad object but not a line that is JSON of another shape ("x", 1).
        raise ConfigError("log", f"{path} holds a line that is not a run-log entry") from None


def _scenario(data: Any, where: str) -> Scenario:
    try:
        return scenario_from_dict(data)
    except ConfigError as exc:
        raise ConfigError("log", f"{where}: its scenario does not load ({exc})") from None


# Field types the report relies on; `None` in a tuple allows a missing value.
_EXAMPLE_FIELDS: dict[str, tuple[type, ...]] = {
    "run": (str,), "variant": (str,), "world": (str,), "ok": (bool,), "seconds": (int, float)}
_VERDICT_FIELDS: dict[str, tuple[type, ...]] = {
    "step": (int, type(None)), "checker": (str,), "ok": (bool,), "detail": (str,),
    "applied": (bool, type(None)), "phase": (str, type(None))}
_FINDING_FIELDS: dict[str, tuple[type, ...]] = {
    "run": (str,), "variant": (str,), "world": (str,), "found": (bool,),
    "checker": (str, type(None)), "examples": (int,), "seconds": (int, float),
    "replay": (str, type(None)), "blob": (str, type(None)),
    "failed_runs": (int, type(None)), "runs": (int, type(None))}


def _check_fields(obj: object, types: dict[str, tuple[type, ...]], where: str) -> None:
    for name, allowed in types.items():
        value = getattr(obj, name)
        # bool is an int to isinstance; only a bool field may hold one.
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            kinds = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
            raise ConfigError("log", f"{where}: `{name}` is {value!r}, not {kinds}")
