"""How much each checker judged: per checker, over a run's, a search's or a report's
verdicts, how many held, failed or did not apply (nothing to judge). A verdict that did not
apply is never counted as held; a passing verdict of a run log written before verdicts said
whether they applied is counted as unknown."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.check.verdict import Outcome, Verdict
from harness.invariants import CheckerName

HELD, FAILED, NOT_APPLICABLE = (o.value for o in Outcome)
UNKNOWN = "unknown"  # held or not applicable: the log predates `applied`
OUTCOMES = (HELD, FAILED, NOT_APPLICABLE, UNKNOWN)


@dataclass(frozen=True)
class CheckerCoverage:
    checker: str
    held: int = 0
    failed: int = 0
    not_applicable: int = 0
    unknown: int = 0

    @property
    def judged(self) -> int:
        return self.held + self.failed

    def to_dict(self) -> dict[str, Any]:
        return {"checker": self.checker, "judged": self.judged, "held": self.held,
                "failed": self.failed, "not_applicable": self.not_applicable,
                "unknown": self.unknown}


class CoverageTally:
    """Verdict outcomes counted per checker as they come (a search judges thousands)."""

    def __init__(self) -> None:
        self._counts: dict[str, Counter[str]] = {}

    def add(self, checker: str, outcome: str, count: int = 1) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown verdict outcome {outcome!r}")
        self._counts.setdefault(checker, Counter())[outcome] += count

    def add_verdicts(self, verdicts: Iterable[Verdict]) -> None:
        for v in verdicts:
            self.add(v.checker, v.outcome.value)

    def coverage(self) -> tuple[CheckerCoverage, ...]:
        """Registry order (CheckerName's), then checkers it no longer names, by name."""
        order = {str(name): i for i, name in enumerate(CheckerName)}
        names = sorted(self._counts, key=lambda c: (order.get(c, len(order)), c))
        return tuple(CheckerCoverage(c, *(self._counts[c][o] for o in OUTCOMES))
                     for c in names)


def coverage_of_verdicts(verdicts: Iterable[Verdict]) -> tuple[CheckerCoverage, ...]:
    tally = CoverageTally()
    tally.add_verdicts(verdicts)
    return tally.coverage()


def coverage_of(outcomes: Iterable[tuple[str, str]]) -> tuple[CheckerCoverage, ...]:
    """Coverage of (checker, outcome) pairs."""
    tally = CoverageTally()
    for checker, outcome in outcomes:
        tally.add(checker, outcome)
    return tally.coverage()


def merged(coverages: Iterable[Sequence[CheckerCoverage]]) -> tuple[CheckerCoverage, ...]:
    tally = CoverageTally()
    for coverage in coverages:
        for c in coverage:
            for outcome, count in zip(OUTCOMES, _counts(c), strict=True):
                tally.add(c.checker, outcome, count)
    return tally.coverage()


def _counts(c: CheckerCoverage) -> tuple[int, int, int, int]:
    return c.held, c.failed, c.not_applicable, c.unknown


def coverage_from_dicts(rows: Iterable[Mapping[str, Any]]) -> tuple[CheckerCoverage, ...]:
    """Coverage back from `to_dict` rows (a fuzz job's JSON); a bad row is a ValueError."""
    try:
        return tuple(CheckerCoverage(str(r["checker"]), int(r["held"]), int(r["failed"]),
                                     int(r["not_applicable"]), int(r.get("unknown", 0)))
                     for r in rows)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a coverage row: {exc}") from None


def coverage_lines(coverage: Sequence[CheckerCoverage], over: str) -> list[str]:
    """A table, one row per checker: verdicts judged (held + failed), held, failed, n/a
    (and unknown, where a log left it so); then the checkers that judged nothing."""
    unknown = any(c.unknown for c in coverage)
    width = max([len("checker"), *(len(c.checker) for c in coverage)])
    head = f"  {'checker':{width}} {'judged':>6} {'held':>6} {'failed':>6} {'n/a':>6}"
    lines = [f"coverage over {over} (verdicts per checker; n/a: nothing to judge, never "
             "counted as held" + ("; unknown: logged before verdicts said whether they "
                                  "applied" if unknown else "") + "):",
             head + (f" {'unknown':>7}" if unknown else "")]
    for c in coverage:
        row = (f"  {c.checker:{width}} {c.judged:>6} {c.held:>6} {c.failed:>6} "
               f"{c.not_applicable:>6}")
        lines.append(row + (f" {c.unknown:>7}" if unknown else ""))
    idle = [c.checker for c in coverage if not c.judged and not c.unknown]
    if idle:
        lines.append(f"  judged nothing: {', '.join(idle)}")
    return lines
