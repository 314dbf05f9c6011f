"""A budgeted Hypothesis search over DP skew on a world: the checkers are the property.

Every scenario the search draws runs on the world and goes through every checker; the first
failing one is raised to Hypothesis, which shrinks the scenario. A world run is the costly
part, so results are memoised by scenario (shrinking revisits many), the search stops at the
budget, and shrinking stops after its own bounds, keeping the smallest failure so far.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

from hypothesis import HealthCheck, Phase, Verbosity, given, settings, target
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.database import ExampleDatabase
from hypothesis.errors import Flaky, Unsatisfiable

from harness.check.coverage import CoverageTally
from harness.errors import HarnessCannot
from harness.fuzz import profiles  # noqa: F401 - registers the profiles by name
from harness.fuzz.database import KeyedDatabase, SharedFailures, StoppableDatabase, open_database
from harness.fuzz.example_verdict import first_failure
from harness.fuzz.known_verdicts import KnownVerdicts
from harness.fuzz.profiles import reproduce_blob
from harness.fuzz.reduce import reduce_structure, reduce_tokens
from harness.fuzz.result import NOT_SHRUNK, ExampleVerdict, FuzzOutcome, SetAside
from harness.fuzz.run_log import Intermittency, append, example_entry
from harness.fuzz.schedules import ScheduleSpace, keyed_fields, scheduled
from harness.fuzz.signals import (
    _BudgetSpent,
    _Cannot,
    _CheckerFailed,
    _Intermittent,
    _SharedFailure,
    _ShrinkCut,
)
from harness.fuzz.variants import Variant
from harness.gen.aim import steering
from harness.gen.strategies import fuzz_configs, scenarios
from harness.history.scenario_history import ScenarioHistory
from harness.reference_plans import judge_run
from harness.scenario import Scenario
from harness.timeouts import Timeouts

# Short bounds: a hang is found in seconds, and a failing example costs little to shrink.
# A failure is only believed once it reproduces on a second run: the first one at once, the
# shrunk one at the end (see _Search.verdict and _Search.confirmed). A first failure that
# passes its rerun is run INTERMITTENT_RERUNS more times and reported as intermittent.
FUZZ_TIMEOUTS = Timeouts(collective_s=1.0, hang_s=1.5, step_deadline_s=3.0)
SIM_DP_SIZES = (2, 3, 4)
MAX_STEPS = 4  # steps per scenario: each config's capture serves several token vectors
CONFIRM_TRIES = 3  # shrunk failures rerun, newest first, before falling back to the first
INTERMITTENT_RERUNS = 3  # more runs of a failure that passed its rerun: how often it fails


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
        return self.examples if self.examples is not None else 1_000_000


def replay_command(path: str, world: str, world_flags: str = "") -> str:
    command = f"python -m harness run --scenario {shlex.quote(path)} --world {world}"
    return f"{command} {world_flags}".rstrip()


@dataclass
class _Search:
    """The mutable state of one search, seen by the Hypothesis test body."""

    run: Callable[[Scenario], ScenarioHistory]
    variant: Variant
    world: str
    budget: Budget
    log_path: Path | None
    progress: Callable[[int, float, bool], None] | None
    hunt: tuple[str, ...] | None = None  # only these checkers' failures count
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

    def begin_run(self) -> None:
        """A Hypothesis run starts: its reuse phase replays what is saved now."""
        self.calls = 0
        if self.database is not None:
            self.database.muted = False
        self.saved_at_start = self.shared.look() if self.shared is not None else 0
        self.replayed += self.saved_at_start

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
        verdict = first_failure(result, self.variant.caught_by, self.hunt)
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


def scenario_strategy(variant: Variant, fixed: Mapping[str, Any],
                      dp_sizes: tuple[int, ...]) -> st.SearchStrategy[Scenario]:
    """The variant's planted bug and the user's pinned fields over the fuzzer's space."""
    pinned = {**dict(variant.changes), **fixed}
    config = fuzz_configs(pinned, dp_sizes=dp_sizes, ubatch_counts=variant.ubatch_counts,
                          drawn=dict(variant.drawn), drafts_every=variant.drafts_every)
    return scenarios(config, max_steps=MAX_STEPS, fault_kinds=variant.fault_kinds,
                     fault_every=variant.fault_every, name=f"fuzz-{variant.name}")


def database_key(variant: Variant, fixed: Mapping[str, Any], dp_sizes: tuple[int, ...]) -> bytes:
    """Failures are kept per variant, pinned fields and DP sizes: replayed first next time."""
    text = json.dumps([variant.name, sorted((k, str(v)) for k, v in fixed.items()),
                       list(dp_sizes)])
    return hashlib.sha256(text.encode()).digest()


def fuzz(variant: Variant, run: Callable[[Scenario], ScenarioHistory], *, world: str,
         dp_sizes: tuple[int, ...], fixed: Mapping[str, Any] | None = None,
         budget: Budget = Budget(), profile: str = "dev",
         database: str | ExampleDatabase | None = None,
         log_path: str | Path | None = None, scenario_dir: str | Path = ".harness/found",
         seed: int | None = None, hunt: tuple[str, ...] | None = None,
         progress: Callable[[int, float, bool], None] | None = None,
         world_flags: str = "", schedules: ScheduleSpace | None = None) -> FuzzOutcome:
    """Search for a scenario some checker (one of `hunt`, if given) rejects; shrink and
    return it (an intermittent failure as found), or report that none was found within the
    budget. `world_flags` complete the replay command (e.g. `--backend nccl`). `database` is
    a directory, a redis:// URL or an open database; failures saved there by any process are
    replayed first; `schedules`, how each example's threads interleave (None: os).
    HarnessCannot (an example not run or judged) ends the search, raised."""
    fixed = dict(fixed or {})
    key = database_key(variant, keyed_fields(fixed, schedules), dp_sizes)
    opened = open_database(database) if isinstance(database, str) else database
    db = StoppableDatabase(KeyedDatabase(opened, key)) if opened is not None else None
    search = _Search(run, variant, world, budget, Path(log_path) if log_path else None,
                     progress, hunt, SharedFailures(opened, key) if opened is not None else None,
                     db)
    strategy = scheduled(scenario_strategy(variant, fixed, dp_sizes), schedules)
    probe = _hypothesis_test(search, strategy, profile, db, seed)
    failure, note = _run_until_settled(probe, search)
    if failure is None and search.set_aside:
        first = search.set_aside[0]
        search.found_at, search.found_by = (first.examples, first.seconds), first.found_by
        why = f"{note or 'examples exhausted'} with nothing that reproduces; {NOT_SHRUNK}"
        return _found(search, first.scenario, first.verdict, None, why, Path(scenario_dir),
                      world_flags)
    if failure is None:
        return FuzzOutcome(variant.name, world, False, None, "", None, search.examples,
                           search.elapsed(), None, None, None, None,
                           note or "examples exhausted", tuple(search.unconfirmed),
                           search.replayed, None, search.restarts,
                           coverage=search.tally.coverage())
    if isinstance(failure, _Intermittent):
        return _found(search, failure.scenario, failure.verdict, None, NOT_SHRUNK,
                      Path(scenario_dir), world_flags)
    simpler = reduce_structure(search.last_failing, lambda s: search.fails_like(s, failure),
                               dp_sizes)
    search.begin_shrinker()
    minimal = reduce_tokens(simpler, lambda s: search.fails_like(s, failure, bounded=True))
    minimal, verdict = search.confirmed(minimal)
    return _found(search, minimal, verdict, reproduce_blob(failure), note, Path(scenario_dir),
                  world_flags)


def _found(search: _Search, scenario: Scenario, verdict: ExampleVerdict, blob: str | None,
           note: str, scenario_dir: Path, world_flags: str) -> FuzzOutcome:
    """The finding saved as a regression scenario (the checker that must catch it, and the
    undo), logged, and reported."""
    runs = verdict.intermittency
    saved = replace(scenario, caught_by=verdict.checker, reference_changes=search.variant.undo,
                    description=f"{runs.label}: {runs.detail}" if runs else scenario.description)
    path = scenario_dir / f"{search.variant.name}-{search.run_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(saved.to_json() + "\n")
    found_examples, found_seconds = search.found_at or (None, None)
    outcome = FuzzOutcome(search.variant.name, search.world, True, verdict.checker,
                          verdict.detail, saved, search.examples, search.elapsed(),
                          found_examples, found_seconds,
                          replay_command(str(path), search.world, world_flags), blob, note,
                          tuple(search.unconfirmed), search.replayed, search.found_by,
                          search.restarts, runs, search.tally.coverage(),
                          tuple(entry.scenario for entry in search.set_aside))
    if search.log_path is not None:
        append(search.log_path, outcome.finding_entry(search.run_id))
    return outcome


def _hypothesis_test(search: _Search, strategy: st.SearchStrategy[Scenario], profile: str,
                     db: ExampleDatabase | None, seed: int | None) -> Callable[[], None]:
    """The Hypothesis test of one search: draw, steer, run on the world, fail on a verdict."""

    def probe(data: st.DataObject) -> None:
        search.calls += 1
        scenario = data.draw(strategy, label="scenario")
        for label, value in steering(scenario).items():
            target(value, label=label)
        verdict = search.verdict(scenario)
        if verdict is None:  # past the shrink's bounds: stop it here, not after its draws
            search._stop(_ShrinkCut())
        if not verdict.ok:
            # Hypothesis replays the minimal example last: this ends up the shrunk one.
            search.last_failing = scenario
            raise _CheckerFailed(verdict)

    test = given(st.data())(probe)
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    # Applied over @seed, which turns the database off: a seeded job still shares it.
    return settings(settings.get_profile(profile), max_examples=search.budget.max_examples,
                    database=db, deadline=None,
                    phases=[Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
                    report_multiple_bugs=False, print_blob=True, verbosity=Verbosity.quiet,
                    suppress_health_check=list(HealthCheck))(test)


def _run_until_settled(probe: Callable[[], None], search: _Search
                       ) -> tuple[_CheckerFailed | _Intermittent | None, str]:
    """Run the Hypothesis test, again each time another process shares a failure (the
    memo keeps what was run); returns the failure raised, or why the search ended."""
    while True:
        search.begin_run()
        try:
            probe()
            return None, ""
        except _SharedFailure:
            search.restarts += 1
            continue
        except _BudgetSpent:
            return None, "budget spent"
        except _Cannot as stop:
            raise stop.cannot from None
        except (_CheckerFailed, _Intermittent) as exc:
            return exc, ""
        except _ShrinkCut:
            return _CheckerFailed(search.verdict(search.last_failing, shrink_bounded=False)), ""
        except Flaky as exc:
            # Name what each run raised, not only how many: the note is all a CI log keeps.
            raised = "; ".join(f"{type(e).__name__}: {e}"
                               for e in getattr(exc, "exceptions", ()))
            note = (f"flaky: a failure did not replay the same way ({exc}"
                    f"{': ' if raised else ''}{raised})")
            if search.first_failing is None or search.last_failing is None:
                return None, note
            # A failure that failed on its rerun stays a finding, however Hypothesis's
            # replay of it went: it is shrunk from the last failing example.
            first = search.verdict(search.first_failing, shrink_bounded=False)
            return _CheckerFailed(first), note
        except Unsatisfiable:
            return None, "no legal scenario: the pinned fields exclude every draw"
