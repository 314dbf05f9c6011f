"""What a world hands back for a scenario, and how the driver judges it: the reference is
computed here and every rank's records go through the checkers. Shared by every world."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.check.checkers import ReferenceRows, Verdict, check_startup, check_step
from harness.check.records import StartupRecord, StepRecord
from harness.errors import ConfigError
from harness.model.moe import MoEWeights, initial_state
from harness.model.reference import reference_step
from harness.scenario import Scenario
from harness.sut.step_plan import plan_without_world
from harness.sut.systems import reference_config

DEVICE_MARGIN_S = 0.5

# Start-up verdicts after which the steps still run (their consequences show in the steps).
STEPS_RUN_AFTER = ("graphs_reachable", "graphs_capture_work", "capture_symmetry")


@dataclass(frozen=True)
class Timeouts:
    collective_s: float = 5.0  # gloo group timeout and every all-to-all wait
    hang_s: float = 10.0  # a microbatch waiting this long for its turn is a hang
    step_deadline_s: float = 30.0  # a rank's whole step

    def __post_init__(self) -> None:
        # A microbatch waits for its turn while its sibling may sit in a collective that is
        # about to time out: the turn wait must outlast it, or a clean failure reads as a hang.
        if self.hang_s <= self.collective_s:
            raise ConfigError("hang_timeout", f"{self.hang_s} s must exceed the collective "
                              f"timeout {self.collective_s} s")
        if self.step_deadline_s <= self.hang_s + self.collective_s:
            raise ConfigError("deadline", f"{self.step_deadline_s} s must exceed the hang plus "
                              f"collective timeouts ({self.hang_s + self.collective_s} s)")

    @property
    def startup_deadline_s(self) -> float:
        return 4 * self.step_deadline_s

    def with_device_fence(self) -> Timeouts:
        """The bounds of a world whose ranks wait for their GPU work after each step (NCCL):
        a step that failed on a collective may then wait one more collective bound before
        its device counts as wedged. `DEVICE_MARGIN_S` covers polling and launches."""
        hang = max(self.hang_s, self.collective_s + DEVICE_MARGIN_S)
        deadline = max(self.step_deadline_s, hang + 2 * self.collective_s + DEVICE_MARGIN_S)
        return Timeouts(self.collective_s, hang, deadline)


DEFAULT_TIMEOUTS = Timeouts()


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
    evidence: str = ""  # stacks and last collectives of a hung or crashed world

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.startup_verdicts) and all(s.ok for s in self.steps)

    def failed_verdicts(self) -> list[tuple[int | None, Verdict]]:
        out = [(None, v) for v in self.startup_verdicts if not v.ok]
        for i, step in enumerate(self.steps):
            out += [(i, v) for v in step.verdicts if not v.ok]
        return out


def startup_lets_steps_run(verdicts: Sequence[Verdict]) -> bool:
    return all(v.ok or v.checker in STEPS_RUN_AFTER for v in verdicts)


def step_failed(records: Sequence[StepRecord | None]) -> bool:
    """After this step the world stops: a rank hung or failed, so its groups are suspect."""
    return any(r is None or r.error is not None for r in records)


def reference_rows(scenario: Scenario) -> list[ReferenceRows]:
    """The single-process reference of every step, each from the previous step's state."""
    config = scenario.config
    weights = MoEWeights.build(config)
    states = [initial_state(config, rank) for rank in range(config.dp_size)]
    judge_by = reference_config(config)  # another system's decisions are held to these
    rows = []
    for i, requests in enumerate(scenario.requests()):
        ref = reference_step(config, weights, requests, states)
        states = ref.states
        plans = (None if judge_by is None
                 else tuple(plan_without_world(judge_by, scenario.batches(i))))
        rows.append(ReferenceRows(tuple(_rows(t) for t in ref.outputs),
                                  tuple(_rows(t) for t in ref.states),
                                  tuple(tuple(sorted(c.elements())) for c in ref.routes),
                                  plans))
    return rows


def _rows(t) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(row) for row in t.tolist())


def judge(scenario: Scenario, startup: Sequence[StartupRecord | None],
          steps: Sequence[Sequence[StepRecord | None]], timeouts: Timeouts,
          evidence: str = "") -> ScenarioResult:
    references = reference_rows(scenario)
    startup_verdicts = tuple(check_startup(startup, timeouts.startup_deadline_s))
    results = tuple(StepResult(tuple(records), tuple(check_step(
        records, references[i], timeouts.step_deadline_s))) for i, records in enumerate(steps))
    return ScenarioResult(scenario, tuple(startup), startup_verdicts, results, evidence)
