"""The one-scenario protocol's collection: every rank's start-up record, then its steps, each
step's go-ahead sent once every rank reported it. Every wait is bounded: a rank silent past
its deadline is a hang (every rank's stacks and last collective become the evidence), and a
rank whose channel closed is named by how it went (killed, crashed, its agent lost). A rank
whose own harness code raised (WorkerCannot) is no finding: HarnessCannot is raised."""

from __future__ import annotations

import time
from pathlib import Path

from harness.errors import ErrorOrigin, HarnessCannot
from harness.faults import FaultKind
from harness.history.records import StartupRecord, StepRecord
from harness.history.scenario_history import step_failed, steps_may_run
from harness.history.step_error import StepError
from harness.scenario import Scenario
from harness.timeouts import Timeouts
from harness.world.channel.links import RankLinks
from harness.world.channel.messages import (
    AgentLost,
    Message,
    NextStep,
    ScenarioDone,
    StartSteps,
    StartupReport,
    StepOverdue,
    StepReport,
    WorkerCannot,
)
from harness.world.evidence import fatal_error, last_collective, native_abort_message
from harness.world.torchrun.rig import Rig
from harness.world.trace_layout import TraceLayout


class _Collection:
    """What the ranks have reported so far of one scenario."""

    def __init__(self, scenario: Scenario, links: RankLinks, rig: Rig, nproc: int,
                 timeouts: Timeouts) -> None:
        self.scenario, self.links, self.rig, self.n = scenario, links, rig, nproc
        self.timeouts = timeouts
        self.startup: list[StartupRecord | None] = [None] * nproc
        self.steps: list[list[StepRecord | None]] = []
        self.done: set[int] = set()
        self.lost: dict[int, StepError] = {}
        start = time.monotonic() + timeouts.startup_deadline_s
        self.deadline = dict.fromkeys(range(nproc), start)

    def waiting(self) -> list[int]:
        return [r for r in range(self.n) if r not in self.done and r not in self.lost]

    def take(self, rank: int, message: Message | None) -> bool:
        """Note one message (None: the channel closed); True when the rank is no longer read."""
        if message is None:
            self.lost[rank] = _lost_error(rank, self.scenario, self.rig.trace_dir_of(rank))
            self.links.send_to_all(NextStep(False))  # the survivors stop after it
            return True
        self.deadline[rank] = time.monotonic() + self.timeouts.step_wait_s
        match message:
            case StartupReport(record):
                self.startup[rank] = record
                if all(r is not None for r in self.startup):
                    self.links.send_to_all(StartSteps(steps_may_run(self.startup)))
            case StepReport(index, record):
                while len(self.steps) <= index:
                    self.steps.append([None] * self.n)
                self.steps[index][rank] = record
                if all(r is not None for r in self.steps[index]):
                    self.links.send_to_all(NextStep(not step_failed(self.steps[index])))
            case StepOverdue():
                # Its step ran past the deadline liveness judges by: late now, not after
                # the slack its message had to cross the machine (step_watch.py).
                self.deadline[rank] = time.monotonic()
            case ScenarioDone():
                self.done.add(rank)
            case AgentLost(_, agent_pid):  # multi-node: its node's agent died
                self.lost[rank] = self.rig.agent_lost(rank, agent_pid)
                self.links.send_to_all(NextStep(False))
                return True
            case WorkerCannot(_, what, line, traceback):
                # The harness's own code raised in the rank: no record, no finding;
                # TorchrunWorld.run ends the world and raises it on.
                raise HarnessCannot(what, line, traceback)
        return False


def collect_scenario(scenario: Scenario, links: RankLinks, rig: Rig, nproc: int,
                     timeouts: Timeouts):
    """(start-up records, steps, evidence) of `scenario`; evidence is empty when no rank
    was lost or late."""
    c = _Collection(scenario, links, rig, nproc, timeouts)
    with links.inbox() as inbox:
        while c.waiting():
            waiting = c.waiting()
            wait = max(0.0, min(c.deadline[r] for r in waiting) - time.monotonic())
            ready = inbox.poll(wait, timeouts.collective_s)
            if not ready:
                late = [r for r in waiting if time.monotonic() >= c.deadline[r]]
                if late:
                    _open_hung_step(scenario, c.startup, c.steps, nproc)
                    evidence = rig.rank_evidence(
                        f"ranks {late} missed their deadline at step "
                        f"{max(len(c.steps) - 1, 0)}", links)
                    return c.startup, _up_to_first_failure(c.steps), evidence
                continue
            for rank, message in ready:
                if c.take(rank, message) and message is not None:
                    inbox.drop(rank)
    if not c.lost:
        return c.startup, c.steps, ""
    if startup_complete := all(r is not None for r in c.startup):
        _record_lost(c.lost, c.steps, nproc)
    evidence = "\n".join(f"rank {r} {error.message}" for r, error in sorted(c.lost.items()))
    return c.startup, _up_to_first_failure(c.steps) if startup_complete else [], evidence


def _record_lost(lost: dict[int, StepError], steps, nproc: int) -> None:
    """A rank gone mid-scenario gets a failed record at the step it never finished."""
    for rank, error in lost.items():
        index = next((i for i, s in enumerate(steps) if s[rank] is None), len(steps))
        if index == len(steps):
            steps.append([None] * nproc)
        steps[index][rank] = StepRecord.failed(
            rank, index, error,
            injected_fault=error.origin in (ErrorOrigin.KILLED, ErrorOrigin.INJECTED))


def _lost_error(rank: int, scenario: Scenario, trace_dir: Path) -> StepError:
    """Why a rank's channel closed: the scenario killed it, its process died of a fatal
    signal (named, with the collective it last issued), or it went away otherwise."""
    kinds = {f.kind for f in scenario.faults if f.rank == rank}
    if FaultKind.KILL_RANK in kinds:
        return StepError("RankKilled", "was killed (injected kill_rank)", None,
                         ErrorOrigin.KILLED)
    fatal = fatal_error(trace_dir, rank)
    if fatal is not None:
        last = last_collective(trace_dir, rank)
        where = (f"; its last collective: {last}" if last
                 else "; before any collective of its step")
        origin = ErrorOrigin.INJECTED if FaultKind.ABORT_RANK in kinds else ErrorOrigin.CRASHED
        # What a native library said as it aborted (gloo's failed check), from the workers'
        # shared log: written before the abort, so before the channel closed.
        log = TraceLayout(trace_dir).torchrun_log
        native = native_abort_message(log.read_text(errors="replace")) if log.exists() else None
        return StepError("RankCrashed", f"died of a fatal signal ({fatal}){where}", native,
                         origin)
    return StepError("RankLost", "lost its process (ended by torchrun after a peer died, or "
                     "crashed)", None, ErrorOrigin.LOST)


def _open_hung_step(scenario: Scenario, startup, steps, n: int) -> None:
    """Every rank reported the last step, which went well, yet some never came back: they
    hang in the next one, which gets a row (of None for whoever never reported it), so the
    hang is judged, even when every rank is stuck (vLLM's own waits have no bound)."""
    if any(r is None for r in startup) or len(steps) >= len(scenario.steps):
        return
    if not steps or (all(r is not None for r in steps[-1]) and not step_failed(steps[-1])):
        steps.append([None] * n)


def _up_to_first_failure(steps):
    """Steps past the first failed one are partial (ranks stop after a failure)."""
    first = next((i for i, s in enumerate(steps) if step_failed(s)), None)
    return steps if first is None else steps[:first + 1]
