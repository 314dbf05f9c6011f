"""The checker registry: every checker once, with its name (harness/invariants.py), its
phase (start-up, step, scenario) and its function. The judge runs a phase's checkers in this
order; a checker whose input the run did not produce gives a verdict of "not applicable",
never "held"; a checker that raises gives no verdict but HarnessCannot naming it (exit 3)."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from harness.check import (
    checkers,
    dead_slots,
    execution,
    startup,
    stream_order,
    token_cover,
    vllm_exec,
    whole_run,
)
from harness.check.reference import ReferenceRows
from harness.check.verdict import Judgement, Verdict, not_applicable
from harness.config import HarnessConfig
from harness.errors import HarnessCannot, one_line
from harness.history.records import StartupRecord, StepRecord
from harness.invariants import CheckerName as N


class Phase(Enum):
    STARTUP = "start-up"  # over every rank's start-up (capture) record
    STEP = "step"  # over every rank's record of one step, with its reference
    SCENARIO = "scenario"  # once per scenario, over every step's records at once


@dataclass(frozen=True)
class StartupInputs:
    records: tuple[StartupRecord | None, ...]  # None: the rank never finished capture
    deadline_s: float
    config: HarnessConfig  # what the spec judges the captured graphs' reach by


@dataclass(frozen=True)
class StepInputs:
    records: tuple[StepRecord | None, ...]  # None: the rank was still running at the deadline
    reference: ReferenceRows
    deadline_s: float
    evidence: str = ""  # stacks and last collectives of a hung or crashed world


@dataclass(frozen=True)
class ScenarioInputs:
    planned_steps: int  # the steps the scenario has; the history may stop before them
    startup: tuple[StartupRecord | None, ...]
    steps: tuple[tuple[StepRecord | None, ...], ...]  # per step that ran, per rank


@dataclass(frozen=True)
class Checker:
    name: N
    phase: Phase
    judge: Callable[[Any], Judgement]
    # False: the checker reads a record of every rank, and does not apply when one is missing.
    judges_missing_ranks: bool = False

    def run(self, inputs: StartupInputs | StepInputs | ScenarioInputs) -> Verdict:
        missing = ([] if self.judges_missing_ranks else
                   [r for r, rec in enumerate(inputs.records) if rec is None])
        try:
            judged = (not_applicable(f"ranks {missing} left no record") if missing
                      else self.judge(inputs))
        except Exception as exc:  # a bug of the checker's, not a finding: exit 3, one line
            raise HarnessCannot(f"checker {self.name}", f"raised {one_line(exc)}",
                                traceback.format_exc()) from exc
        return Verdict(str(self.name), judged.outcome, judged.detail)


def _compared(plans: Sequence[object] | None, why_absent: str,
              compare: Callable[[Sequence[object]], Judgement]) -> Judgement:
    return not_applicable(why_absent) if plans is None else compare(plans)


def _differential(s: StepInputs) -> Judgement:
    return _compared(s.reference.plans, "the harness decided: nothing to compare with",
                     lambda plans: checkers.check_differential(s.records, plans))


def _differential_base(s: StepInputs) -> Judgement:
    if s.reference.plans is None:
        return not_applicable("the harness decided: no base vLLM to compare with")
    return _compared(s.reference.base_plans, "no comparison with the unpatched vLLM was asked",
                     lambda base: checkers.check_differential_base(s.records, base,
                                                                   s.reference.plans))


def _spec_decision(s: StepInputs) -> Judgement:
    return _compared(s.reference.spec_plans, "another system decided: held by differential",
                     lambda plans: checkers.check_spec_decision(s.records, plans))


def _dead_slots(s: StepInputs) -> Judgement:
    ref = s.reference
    return dead_slots.check_dead_slots_left_out(s.records, ref.dead, ref.known_dead,
                                                ref.plans_over_live_columns,
                                                ref.plans_keeping_dead)


def _startup(judge: Callable[[Sequence[StartupRecord]], Judgement]) -> Callable[..., Judgement]:
    return lambda s: judge(s.records)


def _records(judge: Callable[[Sequence[StepRecord]], Judgement]) -> Callable[..., Judgement]:
    return lambda s: judge(s.records)


REGISTRY: tuple[Checker, ...] = (
    Checker(N.STARTUP, Phase.STARTUP,
            lambda s: startup.check_capture_finished(s.records, s.deadline_s),
            judges_missing_ranks=True),
    Checker(N.CAPTURE_HYGIENE, Phase.STARTUP, _startup(startup.check_capture_hygiene)),
    Checker(N.GRAPHS_CAPTURE_WORK, Phase.STARTUP, _startup(startup.check_graphs_capture_work)),
    Checker(N.CAPTURE_SYMMETRY, Phase.STARTUP, _startup(startup.check_capture_symmetry)),
    Checker(N.GRAPHS_REACHABLE, Phase.STARTUP,
            lambda s: startup.check_graphs_reachable(s.records, s.config)),
    Checker(N.LIVENESS, Phase.STEP,
            lambda s: checkers.check_liveness(s.records, s.deadline_s, s.evidence),
            judges_missing_ranks=True),
    Checker(N.ERRORS, Phase.STEP, _records(checkers.check_errors), judges_missing_ranks=True),
    Checker(N.AGREEMENT, Phase.STEP, _records(checkers.check_agreement)),
    Checker(N.COLLECTIVE_FINGERPRINTS, Phase.STEP, _records(checkers.check_fingerprints)),
    Checker(N.CAPTURED_SPLIT, Phase.STEP, _records(checkers.check_replay_split)),
    Checker(N.NO_EMPTY_REGION, Phase.STEP, _records(checkers.check_no_empty_region)),
    Checker(N.MATCHES_REFERENCE, Phase.STEP,
            lambda s: checkers.check_reference(s.records, s.reference)),
    Checker(N.ROUTING_PROVENANCE, Phase.STEP,
            lambda s: checkers.check_routing(s.records, s.reference)),
    Checker(N.THREAD_HYGIENE, Phase.STEP, _records(checkers.check_thread_hygiene)),
    Checker(N.EXECUTES_PLAN, Phase.STEP, _records(execution.check_executes_plan)),
    Checker(N.EAGER_SLICES, Phase.STEP, _records(execution.check_eager_slices)),
    Checker(N.SPLIT_CONSENSUS, Phase.STEP, _records(execution.check_split_consensus)),
    Checker(N.DISPATCH_CAPACITY, Phase.STEP, _records(execution.check_dispatch_capacity)),
    Checker(N.FRESH_RECEIVE, Phase.STEP, _records(execution.check_fresh_receive)),
    Checker(N.TOKENS_IN_THEIR_REQUESTS, Phase.STEP,
            lambda s: token_cover.check_tokens_in_their_requests(s.records,
                                                                 s.reference.query_lens)),
    Checker(N.DEAD_SLOTS_LEFT_OUT, Phase.STEP, _dead_slots),
    Checker(N.UBATCHING_STATE, Phase.STEP, _records(vllm_exec.check_ubatching_state)),
    Checker(N.RECV_BEFORE_READ, Phase.STEP, _records(vllm_exec.check_recv_before_read)),
    # Each rank's order is its own: a race is named even beside a rank that left no record.
    Checker(N.STREAM_ORDER, Phase.STEP, _records(stream_order.check_stream_order),
            judges_missing_ranks=True),
    Checker(N.DIFFERENTIAL_BASE, Phase.STEP, _differential_base),
    Checker(N.DIFFERENTIAL, Phase.STEP, _differential),
    Checker(N.SPEC_DECISION, Phase.STEP, _spec_decision),
    # A step missing from the history is one no step checker sees: only the whole run can.
    Checker(N.STEPS_COMPLETE, Phase.SCENARIO,
            lambda s: whole_run.check_steps_complete(s.planned_steps, s.startup, s.steps),
            judges_missing_ranks=True),
)


def checkers_of(phase: Phase) -> tuple[Checker, ...]:
    return tuple(c for c in REGISTRY if c.phase is phase)


def check_startup(records: Sequence[StartupRecord | None], deadline_s: float,
                  config: HarnessConfig) -> list[Verdict]:
    """Every start-up checker's verdict over every rank's capture record."""
    inputs = StartupInputs(tuple(records), deadline_s, config)
    return [c.run(inputs) for c in checkers_of(Phase.STARTUP)]


def check_step(records: Sequence[StepRecord | None], reference: ReferenceRows,
               deadline_s: float, evidence: str = "") -> list[Verdict]:
    """Every step checker's verdict over every rank's record of one step."""
    inputs = StepInputs(tuple(records), reference, deadline_s, evidence)
    return [c.run(inputs) for c in checkers_of(Phase.STEP)]


def check_scenario(planned_steps: int, startup: Sequence[StartupRecord | None],
                   steps: Sequence[Sequence[StepRecord | None]]) -> list[Verdict]:
    """Every scenario checker's verdict, once, over the whole run's records."""
    inputs = ScenarioInputs(planned_steps, tuple(startup), tuple(tuple(s) for s in steps))
    return [c.run(inputs) for c in checkers_of(Phase.SCENARIO)]
