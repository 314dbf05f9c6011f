"""Many runs of one scenario under controlled schedules, each judged.

`random` and `pct` run `runs` schedules, seeds `seed`, `seed + 1`, ...; `exhaustive` walks the
tree of choices depth first, each run replaying a prefix and then never preempting, until
every schedule with at most `preemptions` preemptions has run (`complete`) or `runs` is spent.
A run the scheduler halts as a deadlock is a finding; one it could not control (*stuck*, or a
replay that *diverged*: the scenario is not deterministic under its schedule) is HarnessCannot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from harness.errors import HarnessCannot
from harness.runtime.schedule.descriptor import Schedule
from harness.runtime.schedule.errors import ScheduleHalted
from harness.runtime.schedule.primitives import Primitives
from harness.runtime.schedule.records import Decision, Trace
from harness.runtime.schedule.session import DEFAULT_SAFETY_S, ScheduledRun
from harness.runtime.schedule.strategies import non_preemptive

# Runs the protocol with the given primitives from the calling thread; returns its result.
Scenario = Callable[[Primitives], Any]
# (result, error) -> None when the run held, else what went wrong, in one line.
Judge = Callable[[Any, BaseException | None], str | None]


@dataclass(frozen=True)
class Finding:
    trace: Trace  # trace.schedule replays the run
    verdict: str


@dataclass(frozen=True)
class Exploration:
    mode: str
    visited: int  # schedules run
    complete: bool  # exhaustive: every schedule within the bound has run
    findings: tuple[Finding, ...]

    @property
    def held(self) -> bool:
        return not self.findings


def run_once(schedule: Schedule, scenario: Scenario, judge: Judge,
             safety_s: float = DEFAULT_SAFETY_S) -> tuple[Trace, str | None]:
    """One controlled run, judged: (its trace, None if it held else the verdict)."""
    session = ScheduledRun(schedule, safety_s=safety_s)
    result: Any = None
    error: BaseException | None = None
    try:
        with session:
            try:
                result = scenario(session.primitives)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # judged below, a halt included
                error = exc
    except ScheduleHalted as exc:  # found as the run ended
        error = exc
    trace = session.trace
    assert trace is not None, "run_once needs a controlled schedule"
    if trace.halt is not None and trace.halt.kind != "deadlock":
        raise HarnessCannot("schedule", trace.halt.message, trace.halt.describe())
    if trace.halt is not None:
        return trace, trace.halt.describe()
    return trace, judge(result, error)


def explore(schedule: Schedule, scenario: Scenario, judge: Judge, *, runs: int = 100,
            stop_at_first: bool = True, safety_s: float = DEFAULT_SAFETY_S) -> Exploration:
    if not schedule.controlled:
        raise ValueError("explore needs a controlled schedule (random, pct or exhaustive)")
    if schedule.mode == "exhaustive":
        return _exhaustive(schedule, scenario, judge, runs, stop_at_first, safety_s)
    findings: list[Finding] = []
    visited = 0
    for i in range(runs):
        trace, verdict = run_once(replace(schedule, seed=schedule.seed + i), scenario, judge,
                                  safety_s)
        visited += 1
        if verdict is not None:
            findings.append(Finding(trace, verdict))
            if stop_at_first:
                break
    return Exploration(schedule.mode, visited, False, tuple(findings))


def _exhaustive(schedule: Schedule, scenario: Scenario, judge: Judge, runs: int,
                stop_at_first: bool, safety_s: float) -> Exploration:
    findings: list[Finding] = []
    prefix: tuple[int, ...] | None = schedule.choices
    schedule = replace(schedule, seed=0)  # the walk itself numbers the schedules
    visited = 0
    while True:
        trace, verdict = run_once(schedule.with_choices(prefix), scenario, judge, safety_s)
        visited += 1
        if verdict is not None:
            findings.append(Finding(trace, verdict))
            if stop_at_first:
                return Exploration("exhaustive", visited, False, tuple(findings))
        prefix = next_prefix(trace.decisions, schedule.preemptions)
        if prefix is None or visited >= runs:
            return Exploration("exhaustive", visited, prefix is None, tuple(findings))


def next_prefix(decisions: tuple[Decision, ...], bound: int) -> tuple[int, ...] | None:
    """The next schedule depth first: the deepest decision with an untried alternative
    within the preemption bound, as the choices up to and including it. Alternatives are
    tried in a fixed order (the non-preemptive choice first, then ascending), so that every
    schedule is run once."""
    used = [0]
    for d in decisions:
        used.append(used[-1] + d.preemptive)
    for i in range(len(decisions) - 1, -1, -1):
        d = decisions[i]
        first = non_preemptive(d.at, d.candidates)
        order = (first, *(c for c in d.candidates if c != first))
        for alternative in order[order.index(d.chosen) + 1:]:
            cost = int(d.at in d.candidates and alternative != d.at)
            if used[i] + cost <= bound:
                return tuple(x.chosen for x in decisions[:i]) + (alternative,)
    return None
