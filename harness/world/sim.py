"""The in-process world: N ranks as threads, each with a real gloo group, running the rank
code of `harness.sut.rank_runtime` on a scenario; the driver computes the reference and
hands every rank's records to the checkers.

A scenario stops at the first step with a failed or hung rank: after a collective timed out
its gloo pairs are closed, so later steps would only report the same failure again.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.check.checkers import ReferenceRows, Verdict, check_startup, check_step
from harness.check.records import StartupRecord, StepRecord
from harness.model.moe import MoEWeights, initial_state
from harness.model.reference import reference_step
from harness.scenario import Scenario
from harness.sut.rank_runtime import RankRuntime
from harness.world.threads import ThreadWorld


@dataclass(frozen=True)
class Timeouts:
    collective_s: float = 5.0  # gloo group timeout and every all-to-all wait
    hang_s: float = 5.0  # a microbatch waiting for its turn this long is a hang
    step_deadline_s: float = 20.0  # a rank's whole step

    @property
    def startup_deadline_s(self) -> float:
        return 4 * self.step_deadline_s


@dataclass(frozen=True)
class StepResult:
    records: tuple[StepRecord | None, ...]  # None: the rank was still running at the deadline
    verdicts: tuple[Verdict, ...]

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)


@dataclass(frozen=True)
class ScenarioResult:
    scenario: Scenario
    startup: tuple[StartupRecord | None, ...]
    startup_verdicts: tuple[Verdict, ...]
    steps: tuple[StepResult, ...]

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.startup_verdicts) and all(s.ok for s in self.steps)

    def failed_verdicts(self) -> list[tuple[int | None, Verdict]]:
        out = [(None, v) for v in self.startup_verdicts if not v.ok]
        for i, step in enumerate(self.steps):
            out += [(i, v) for v in step.verdicts if not v.ok]
        return out


def reference_rows(scenario: Scenario) -> list[ReferenceRows]:
    """The single-process reference of every step, each from the previous step's state."""
    config = scenario.config
    weights = MoEWeights.build(config)
    states = [initial_state(config, rank) for rank in range(config.dp_size)]
    rows = []
    for requests in scenario.requests():
        ref = reference_step(config, weights, requests, states)
        states = ref.states
        rows.append(ReferenceRows(tuple(_rows(t) for t in ref.outputs),
                                  tuple(_rows(t) for t in ref.states),
                                  tuple(tuple(sorted(c.elements())) for c in ref.routes)))
    return rows


def _rows(t) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(row) for row in t.tolist())


def run_scenario(scenario: Scenario, timeouts: Timeouts = Timeouts()) -> ScenarioResult:
    config = scenario.config
    requests = scenario.requests()
    references = reference_rows(scenario)
    with ThreadWorld(config.dp_size, timeout_s=timeouts.collective_s) as world:
        runtimes = world.run(lambda rank, group: RankRuntime(
            config, rank, group, collective_timeout_s=timeouts.collective_s,
            hang_timeout_s=timeouts.hang_s))
        startup, _ = world.run_bounded(lambda rank, _g: runtimes[rank].startup(),
                                       timeouts.startup_deadline_s)
        startup_verdicts = tuple(check_startup(startup, timeouts.startup_deadline_s))
        steps: list[StepResult] = []
        if all(v.ok or v.checker in ("graphs_reachable", "graphs_capture_work",
                                     "capture_symmetry") for v in startup_verdicts):
            for i, ranks in enumerate(scenario.steps):
                records, _ = world.run_bounded(
                    lambda rank, _g, i=i, ranks=ranks: runtimes[rank].step(
                        i, requests[i][rank], ranks[rank], scenario.faults_at(i, rank)),
                    timeouts.step_deadline_s + 5.0)
                verdicts = check_step(records, references[i], timeouts.step_deadline_s)
                steps.append(StepResult(tuple(records), tuple(verdicts)))
                if any(r is None or r.error is not None for r in records):
                    break
    return ScenarioResult(scenario, tuple(startup), startup_verdicts, tuple(steps))
