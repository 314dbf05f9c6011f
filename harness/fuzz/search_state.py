"""One search's state, seen by the Hypothesis test body: its budget, the verdict of each
scenario (memoised: shrinking revisits many), the first failure and its reruns, the shrink
steps to confirm, and what was set aside.

A failure is only believed once it reproduces on a second run: the first one at once, the
shrunk one at the end (Search.verdict, Search.confirmed). A first failure that passes its
rerun is run INTERMITTENT_RERUNS more times and reported as intermittent.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NoReturn

from harness.check.coverage import CoverageTally
from harness.errors import HarnessCannot
from harness.fuzz.database import SharedFailures, StoppableDatabase
from harness.fuzz.example_verdict import first_failure
from harness.fuzz.known_verdicts import KnownVerdicts
from harness.fuzz.result import ExampleVerdict, SetAside
from harness.fuzz.run_log import Intermittency, append, example_entry
from harness.fuzz.signals import (
    _BudgetSpent,
    _Cannot,
    _CheckerFailed,
    _Intermittent,
    _SharedFailure,
)
from harness.fuzz.variants import Variant
from harness.history.scenario_history import ScenarioHistory
from harness.reference_plans import judge_run
from harness.scenario import Scenario

CONFIRM_TRIES = 3  # shrunk failures rerun, newest first, before falling back to the first
INTERMITTENT_RERUNS = 3  # more runs of a failure that passed its rerun: how often it fails
ROUND_EXAMPLES = 1000  # per Hypothesis run of a search bounded by time alone (engine.py, _rounds)


@dataclass(frozen=True)
class Budget:
    examples: int | None = None  # world runs at most (None: no bound)
    seconds: float | None = 60.0  # wall-clock search time (None: no bound)
    # Each shrinker (Hypothesis's, then the token pass) stops at the first of these, keeping the
    # smallest failure so far: world runs give one result on any machine, seconds bound a slow one.
    shrink_seconds: float = 30.0
    shrink_examples: int | None = None  # world runs per shrinker (None: no bound)

    @property
    def max_examples(self) -> int:
        return self.examples if self.examples is not None else ROUND_EXAMPLES


@dataclass
class Search:
    """The mutable state of one search, seen by the Hypothesis test body."""

    run: Callable[[Scenario], ScenarioHistory]
    variant: Variant
    world: str
    budget: Budget
    log_path: Path | None
    progress: Callable[[int, float, bool], None] | None
    # Only these checkers' failures count (of a faulted example, in a class hunt of vLLM).
    hunt: tuple[str, ...] | None = None
    shared: SharedFailures | None = None
    database: StoppableDatabase | None = None
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    start: float = field(default_factory=time.monotonic)
    examples: int = 0
    found_at: tuple[int, float] | None = None
    shrink_from: tuple[int, float] | None = None  # examples and seconds as this shrinker began
    results: dict[str, ExampleVerdict] = field(default_factory=dict)
    last_failing: Scenario | None = None
    unconfirmed: list[Scenario] = field(default_factory=list)  # failed once, passed a rerun
    first_failing: Scenario | None = None  # the detection, rerun at once
    believed: list[Scenario] = field(default_factory=list)  # shrink steps, not rerun yet
    saved_at_start: int = 0  # saved failures the current Hypothesis run replays first
    calls: int = 0  # test-body calls in the current Hypothesis run
    found_by: str | None = None
    restarts: int = 0
    replayed: int = 0
    tally: CoverageTally = field(default_factory=CoverageTally)  # every verdict judged
    known: KnownVerdicts = field(default_factory=KnownVerdicts)  # verdicts no run is needed for
    set_aside: list[SetAside] = field(default_factory=list)

    def begin_run(self, counted: bool = True) -> None:
        """A Hypothesis run starts: its reuse phase replays what is saved now (`counted`:
        not a later round, which replays what the memo already judged)."""
        self.calls = 0
        if self.database is not None:
            self.database.muted = False
        self.saved_at_start = self.shared.look() if self.shared is not None else 0
        self.replayed += self.saved_at_start if counted else 0

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def verdict(self, scenario: Scenario, shrink_bounded: bool = True) -> ExampleVerdict | None:
        key = json.dumps(scenario.to_dict(), sort_keys=True)
        known = self.results.get(key) or self.known.verdict_of(scenario)
        if known is not None:
            return known
        if self.found_at is None and self._spent():
            self._stop(_BudgetSpent())
        if self.found_at is None and self.shared is not None and self.shared.arrived():
            self._stop(_SharedFailure())
        if shrink_bounded and self.shrink_from is not None and self._shrink_spent(
                *self.shrink_from):
            return None  # shrinking is over: an unseen candidate counts as no smaller failure
        verdict = self._judge(scenario)
        detected = not verdict.ok and self.found_at is None
        if detected:
            verdict = self._rerun(scenario, verdict)
            if self._sets_aside(scenario, verdict):
                verdict, detected = ExampleVerdict(True), False
        elif not verdict.ok:
            self.believed.append(scenario)  # a shrink step: rerun once, at the end
        self.results[key] = verdict
        if detected:
            self.first_failing = scenario
            self.found_at = self.shrink_from = (self.examples, self.elapsed())
            # The reuse phase runs the saved failures before the search draws anything.
            self.found_by = "replay" if self.calls <= self.saved_at_start else "search"
        if self.progress is not None:
            self.progress(self.examples, self.elapsed(), self.found_at is not None)
        if detected and verdict.intermittency is not None:
            self._stop(_Intermittent(scenario, verdict))
        return verdict

    def _rerun(self, scenario: Scenario, verdict: ExampleVerdict) -> ExampleVerdict:
        """The first failure, rerun at once. One that passes is no less a finding: in a
        harness that hunts races and hangs it is the likeliest real one. It is run a few
        more times (within the budget) to say how often it fails."""
        if not self._judge(scenario).ok:
            return verdict
        failed, runs = 1, 2
        for _ in range(INTERMITTENT_RERUNS):
            if self._spent():
                break
            failed += not self._judge(scenario).ok
            runs += 1
        return replace(verdict, intermittency=Intermittency(failed, runs))

    def _sets_aside(self, scenario: Scenario, verdict: ExampleVerdict) -> bool:
        """A failure that its reruns never reproduced and that was only a bound running out
        (a loaded machine, most likely) does not end the search; kept as the finding in
        case nothing that reproduces is found (harness/fuzz/example_verdict.py)."""
        runs = verdict.intermittency
        if not (verdict.timed_out and runs is not None and runs.failed == 1):
            return False
        self.set_aside.append(SetAside(scenario, verdict, self.examples, self.elapsed(),
                                       "replay" if self.calls <= self.saved_at_start else "search"))
        self.known.forget(scenario)  # its first run's verdict stands for no redraw
        return True

    def _stop(self, signal: BaseException) -> NoReturn:
        if self.database is not None:
            self.database.muted = True  # the example that ends the search is no failure
        raise signal

    def _judge(self, scenario: Scenario) -> ExampleVerdict:
        """One world run, logged, reduced to the checker that matters."""
        began = time.monotonic()
        try:
            result = judge_run(self.run(scenario))
        except HarnessCannot as exc:
            self._stop(_Cannot(exc))
        self.examples += 1
        self.tally.add_verdicts(result.verdicts())
        if self.log_path is not None:
            append(self.log_path, example_entry(self.run_id, self.variant.name, self.world,
                                                scenario, result, time.monotonic() - began))
        sorted_by_class = self.hunt if scenario.faults or \
            not self.variant.hunts_a_shipped_class else None
        verdict = first_failure(result, self.variant.caught_by, sorted_by_class)
        self.known.add(scenario, result, verdict)
        return verdict

    def confirmed(self, minimal: Scenario) -> tuple[Scenario, ExampleVerdict]:
        """The smallest failure that fails again when rerun. Shrink steps are believed on one
        run: the shrunk scenario, then the failures it was shrunk through (newest first, up to
        CONFIRM_TRIES in all) are rerun; the first failure, confirmed when found, is the
        fallback."""
        seen: set[str] = set()
        for candidate in (minimal, *reversed(self.believed)):
            key = candidate.to_json()
            if key in seen:
                continue
            if len(seen) == CONFIRM_TRIES:
                break
            seen.add(key)
            verdict = self.verdict(candidate, shrink_bounded=False)
            if candidate == self.first_failing:
                return candidate, verdict
            if not verdict.ok and not self._judge(candidate).ok:
                return candidate, verdict
            self.unconfirmed.append(candidate)
        return self.first_failing, self.verdict(self.first_failing, shrink_bounded=False)

    def begin_shrinker(self) -> None:
        """The next shrinker starts: it has the shrink bounds to itself."""
        self.shrink_from = (self.examples, self.elapsed())

    def _shrink_spent(self, runs: int, began: float) -> bool:
        b = self.budget
        return (self.elapsed() - began > b.shrink_seconds
                or (b.shrink_examples is not None and self.examples - runs >= b.shrink_examples))

    def fails_like(self, scenario: Scenario, failure: _CheckerFailed,
                   bounded: bool = False) -> bool:
        # The structural pass tries a few candidates only (one step alone, one rank fewer),
        # so it runs unbounded, even after Hypothesis's shrinking used up its bound.
        verdict = self.verdict(scenario, shrink_bounded=bounded)
        return verdict is not None and verdict.checker == failure.verdict.checker

    def _spent(self) -> bool:
        b = self.budget
        return ((b.seconds is not None and self.elapsed() >= b.seconds)
                or (b.examples is not None and self.examples >= b.examples))

