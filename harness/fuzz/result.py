"""What a search reports: the verdict of one example, and the outcome of a whole search.

A failure is believed once it fails again. One that passes its rerun is an intermittent
finding (a race or a hang that shows on some runs only), reported with how often it failed;
one that failed once only by a bound running out is set aside while the search goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.check.coverage import CheckerCoverage
from harness.fuzz.run_log import FindingEntry, Intermittency
from harness.scenario import Scenario

NOT_SHRUNK = ("not shrunk: a shrink believes a candidate on one run, which an intermittent "
              "failure makes unreliable")


@dataclass(frozen=True)
class ExampleVerdict:
    """What the checkers said of one scenario, reduced to what the search needs."""

    ok: bool
    checker: str | None = None
    detail: str = ""
    intermittency: Intermittency | None = None  # set when a failure passed on its rerun
    timed_out: bool = False  # the failure is only bounds running out (fuzz/example_verdict.py)


@dataclass(frozen=True)
class SetAside:
    """A failure the search went on past, and where it stood when it was found."""

    scenario: Scenario
    verdict: ExampleVerdict
    examples: int
    seconds: float
    found_by: str


@dataclass(frozen=True)
class FuzzOutcome:
    variant: str
    world: str
    found: bool
    checker: str | None
    detail: str
    scenario: Scenario | None  # the shrunk scenario (an intermittent one as found)
    examples: int  # world runs in all (search and shrinking)
    seconds: float
    examples_to_detection: int | None  # world runs up to the first failure
    seconds_to_detection: float | None
    replay: str | None
    blob: str | None
    note: str = ""  # why the search ended
    # Shrunk candidates that failed once and passed their rerun (the report fell back).
    unconfirmed: tuple[Scenario, ...] = ()
    replayed: int = 0  # failures saved in the database when the search (re)started
    found_by: str | None = None  # "replay": a saved failure, run before any search; "search"
    restarts: int = 0  # times a failure another process saved restarted this search
    intermittency: Intermittency | None = None  # the finding failed on some runs only
    # Per checker, the verdicts of every example the search judged (reruns and shrinking too).
    coverage: tuple[CheckerCoverage, ...] = ()
    # One-off failures that were only a bound running out: the search went on past them.
    set_aside: tuple[Scenario, ...] = ()

    @property
    def kind(self) -> str | None:
        """None when nothing was found; "reproducible", or "intermittent (r/N)"."""
        if not self.found:
            return None
        return self.intermittency.label if self.intermittency else "reproducible"

    def finding_entry(self, run_id: str) -> FindingEntry:
        runs = self.intermittency
        return FindingEntry(run_id, self.variant, self.world, self.found, self.checker,
                            self.scenario.to_dict() if self.scenario else None,
                            self.examples, round(self.seconds, 3), self.replay, self.blob,
                            self.found_by, self.replayed, runs.failed if runs else None,
                            runs.runs if runs else None)

    def to_json_dict(self) -> dict[str, Any]:
        runs = self.intermittency
        return {"found": self.found, "variant": self.variant, "checker": self.checker,
                "detail": self.detail, "kind": self.kind,
                "failed_runs": runs.failed if runs else None,
                "runs": runs.runs if runs else None,
                "scenario": self.scenario.to_dict() if self.scenario else None,
                "examples": self.examples, "seconds": round(self.seconds, 3),
                "examples_to_detection": self.examples_to_detection,
                "seconds_to_detection": (None if self.seconds_to_detection is None
                                         else round(self.seconds_to_detection, 3)),
                "replay": self.replay, "blob": self.blob, "world": self.world,
                "note": self.note, "unconfirmed": [s.to_dict() for s in self.unconfirmed],
                "replayed": self.replayed, "found_by": self.found_by,
                "restarts": self.restarts,
                "set_aside": [s.to_dict() for s in self.set_aside],
                "coverage": [c.to_dict() for c in self.coverage]}
