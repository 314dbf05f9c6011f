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
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, settings, target
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.database import ExampleDatabase
from hypothesis.errors import Flaky, Unsatisfiable

from harness.fuzz import profiles  # noqa: F401 - registers the profiles by name
from harness.fuzz.database import KeyedDatabase, SharedFailures, StoppableDatabase, open_database
from harness.fuzz.profiles import reproduce_blob
from harness.fuzz.reduce import reduce_structure, reduce_tokens
from harness.fuzz.result import NOT_SHRUNK, ExampleVerdict, FuzzOutcome
from harness.fuzz.run_log import append
from harness.fuzz.schedules import ScheduleSpace, keyed_fields, scheduled
from harness.fuzz.search_state import Budget, Search
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
from harness.scenario import Scenario
from harness.timeouts import Timeouts

# Short bounds: a hang is found in seconds, and a failing example costs little to shrink.
FUZZ_TIMEOUTS = Timeouts(collective_s=1.0, hang_s=1.5, step_deadline_s=3.0)
SIM_DP_SIZES = (2, 3, 4)
MAX_STEPS = 4  # steps per scenario: each config's capture serves several token vectors


def replay_command(path: str, world: str, world_flags: str = "") -> str:
    command = f"python -m harness run --scenario {shlex.quote(path)} --world {world}"
    return f"{command} {world_flags}".rstrip()


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
    search = Search(run, variant, world, budget, Path(log_path) if log_path else None,
                     progress, hunt, SharedFailures(opened, key) if opened is not None else None,
                     db)
    strategy = scheduled(scenario_strategy(variant, fixed, dp_sizes), schedules)
    failure, note = _rounds(search, strategy, profile, db, seed)
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


def _found(search: Search, scenario: Scenario, verdict: ExampleVerdict, blob: str | None,
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


def _rounds(search: Search, strategy: st.SearchStrategy[Scenario], profile: str,
            db: ExampleDatabase | None, seed: int | None
            ) -> tuple[_CheckerFailed | _Intermittent | None, str]:
    """Hypothesis runs until one fails or the budget is spent. Hypothesis gives up to half
    of max_examples to hill-climbing the steering targets: one endless run bounded by time
    alone would climb one example's scores from about its 200th draw to the end, so such a
    search runs in rounds of ROUND_EXAMPLES, each drawn afresh under its own seed."""
    derandomized = settings.get_profile(profile).derandomize
    round_index = 0
    while True:
        before = search.examples
        round_seed = _round_seed(seed, round_index, derandomized)
        probe = _hypothesis_test(search, strategy, profile, db, round_seed)
        failure, note = _run_until_settled(probe, search, first=round_index == 0)
        if (failure is not None or note or search.budget.examples is not None
                or search.examples == before):  # a round that ran nothing new: exhausted
            return failure, note
        round_index += 1


def _round_seed(seed: int | None, round_index: int, derandomized: bool) -> int | None:
    """The seed in the low 32 bits, the round above them. Unseeded rounds draw at random,
    but under a derandomizing profile each round would draw as the first: their own seeds."""
    if seed is None and (round_index == 0 or not derandomized):
        return None
    return (seed or 0) + round_index * 2**32


def _hypothesis_test(search: Search, strategy: st.SearchStrategy[Scenario], profile: str,
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


def _run_until_settled(probe: Callable[[], None], search: Search, first: bool = True
                       ) -> tuple[_CheckerFailed | _Intermittent | None, str]:
    """Run the Hypothesis test, again each time another process shares a failure (the
    memo keeps what was run); returns the failure raised, or why the search ended.
    `first`: the search's first round (its replays of saved failures are counted)."""
    while True:
        search.begin_run(counted=first)
        first = True
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
