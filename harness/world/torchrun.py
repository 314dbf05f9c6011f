"""The torchrun world: N persistent rank processes launched by torchrun, fed by this driver.

One torchrun job per world; it lives across many scenarios and is rebuilt only after a
failure (a hang, a crash, a killed rank). Every wait is bounded; on a missed deadline the
driver collects every rank's Python stacks and last collective, terminates torchrun, kills
any worker left, checks that no process of the world survives, and reports the evidence.
"""

from __future__ import annotations

import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from pathlib import Path

from harness.config import Execution
from harness.errors import ConfigError, ErrorOrigin
from harness.faults import FaultKind
from harness.history.records import StartupRecord, StepRecord
from harness.history.scenario_history import ScenarioHistory, step_failed, steps_may_run
from harness.history.step_error import StepError
from harness.scenario import Scenario
from harness.timeouts import DEFAULT_TIMEOUTS, Timeouts
from harness.world.agent_launch import STOP_TIMEOUT_S, AgentLaunch, launch_agent, spares_by_default
from harness.world.backends import check_backend
from harness.world.batches import BATCH_SIZE, run_batched
from harness.world.evidence import (
    fatal_error,
    last_collective,
    native_abort_message,
    rank_evidence,
)
from harness.world.gpus import pids_holding_gpu_memory
from harness.world.launch import LAUNCH_TIMEOUT_S, WorldError, accept_workers
from harness.world.processes import kill_all, wait_or_signal
from harness.world.wire import Channel, ChannelClosed

__all__ = ["LAUNCH_TIMEOUT_S", "STOP_TIMEOUT_S", "TorchrunWorld", "WorldError"]


class TorchrunWorld:
    # One host's ranks may form a fresh loopback group after a failure (not across nodes).
    soft_rebuilds = True

    def __init__(self, nproc: int, backend: str = "gloo",
                 timeouts: Timeouts = DEFAULT_TIMEOUTS, device: str | None = None,
                 spares: int | None = None, preload_vllm: bool = False) -> None:
        self.layout = check_backend(backend, nproc, device)
        self.nproc = nproc
        self.backend = backend
        self.device = "cuda" if backend == "nccl" else (device or "cpu")
        # Real graphs over NCCL on CUDA; gloo's CUDA collectives cannot be captured.
        self.graphs = "cuda" if backend == "nccl" else "emulated"
        # After a failed step an NCCL rank also waits, bounded, for its device.
        self.timeouts = timeouts.with_device_fence() if backend == "nccl" else timeouts
        self.launches = 0
        self.preload_vllm = preload_vllm
        self.rebuilds = 0  # worlds ended by a failure
        self.regroups = 0  # failures the same rank processes survived with a fresh group
        # Launches kept booting beside a world that has failed once (0 or 1).
        self.spares = spares_by_default(nproc) if spares is None else min(spares, 1)
        self._spare: AgentLaunch | None = None
        self._proc: subprocess.Popen | None = None
        self._channels: dict[int, Channel] = {}
        self.listening_port: int | None = None  # the control port while workers connect
        self.strangers_dropped = 0  # connections that failed the handshake, over all launches
        self._pids: dict[int, int] = {}
        self._dir: Path | None = None
        # (launch, config) -> every rank's start-up records, for configs this launch captured
        # cleanly: only those go in batches (harness/world/batches.py).
        self._clean_captures: dict[tuple, tuple[StartupRecord, ...]] = {}

    # -- life cycle ---------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def rank_pids(self) -> dict[int, int]:
        """Each connected rank's worker pid (empty between launches)."""
        return dict(self._pids)

    def __enter__(self) -> TorchrunWorld:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def start(self) -> None:
        self._close_live()
        launch = self._take_spare() or self._launch()
        if self.launches == 0 and self.layout is not None:
            print(self.layout.describe(), file=sys.stderr, flush=True)
        self._proc, self._dir = launch.proc, launch.trace_dir
        self.listening_port = launch.server.port
        self.launches += 1
        try:
            accept_workers(self, launch.server)
        except BaseException:
            self.close()
            raise
        finally:
            self.strangers_dropped += launch.server.dropped
            launch.server.close()
            self.listening_port = None
        if self.rebuilds and self.spares and self._spare is None:
            self._spare = self._launch()  # a world that failed once is likely to again

    def _launch(self) -> AgentLaunch:
        return launch_agent(self.nproc, [
            "--backend", self.backend, "--device", self.device,
            "--collective-timeout", str(self.timeouts.collective_s),
            *(["--preload-vllm"] if self.preload_vllm else [])])

    def _take_spare(self) -> AgentLaunch | None:
        spare, self._spare = self._spare, None
        if spare is not None and not spare.alive:
            spare.discard()
            return None
        return spare

    def _hello(self, rank: int, rest: tuple) -> None:
        """What else a worker says of itself (a multi-node world notes its node)."""

    def _end_world(self) -> list[int]:
        """End the world after a failure; its replacement boots now, while the driver judges."""
        survivors = self._close_live()
        self.rebuilds += 1
        if self.spares and self._spare is None:
            self._spare = self._launch()
        return survivors

    def _agent_lost(self, rank: int, agent_pid: int) -> StepError:
        return StepError("RankLost", f"lost its torchrun agent (pid {agent_pid})", None,
                         ErrorOrigin.LOST)

    def _trace_dir_of(self, rank: int) -> Path | None:
        return self._dir

    def close(self) -> list[int]:
        """Stop the world and its spare. Returns the pids that were still alive at the end
        (must be empty)."""
        survivors = self._close_live()
        spare, self._spare = self._spare, None
        if spare is not None:
            survivors += spare.discard()
        return survivors

    def _close_live(self) -> list[int]:
        """Stop the live world: ask, then SIGTERM torchrun, then kill what is left."""
        for channel in self._channels.values():
            try:
                channel.send(("exit",))
            except ChannelClosed:
                pass
        if self._proc is not None:
            wait_or_signal(self._proc, 2.0, signal.SIGTERM)
            wait_or_signal(self._proc, STOP_TIMEOUT_S, signal.SIGKILL)
        survivors = kill_all(list(self._pids.values()))
        if self.device == "cuda":
            survivors += pids_holding_gpu_memory(list(self._pids.values()))
        for channel in self._channels.values():
            channel.close()
        self._channels, self._pids, self._proc = {}, {}, None
        self._clean_captures.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        return survivors

    # -- running scenarios -------------------------------------------------------------------

    def run(self, scenario: Scenario) -> ScenarioHistory:
        if scenario.config.dp_size != self.nproc:
            raise ConfigError("dp_size", f"the scenario has {scenario.config.dp_size} ranks "
                              f"but this world has {self.nproc}")
        if not self.alive:
            self.start()
        for channel in self._channels.values():
            channel.send(("run", scenario.to_dict(), asdict(self.timeouts)))
        startup, steps, evidence = self._collect(scenario)
        failed = not steps_may_run(startup) or any(step_failed(s) for s in steps)
        if not evidence and steps_may_run(startup):
            self._clean_captures[(self.launches, scenario.config)] = tuple(startup)
        if failed and not evidence and self._may_regroup(scenario, steps) and self._regroup():
            return ScenarioHistory(scenario, self.timeouts, tuple(startup),
                                   tuple(tuple(s) for s in steps),
                                   "a rank failed; the same ranks formed a fresh group")
        if evidence or failed:
            # A timed-out or broken collective leaves the groups unusable: fresh world next,
            # once every rank still alive has shown where it stands.
            if not evidence:
                evidence = self._rank_evidence("a rank failed; the world is rebuilt")
            survivors = self._end_world()
            if survivors:
                evidence += f"\nprocesses still alive after the kill: {survivors}"
        return ScenarioHistory(scenario, self.timeouts, tuple(startup),
                               tuple(tuple(s) for s in steps), evidence)

    def _may_regroup(self, scenario: Scenario, steps) -> bool:
        """A failure every rank survived, with no thread or run left behind, under vLLM's
        execution code (whose imports make a relaunch cost 15 s on two cores) on gloo."""
        if (not self.soft_rebuilds or scenario.config.execution is not Execution.VLLM
                or self.backend != "gloo"):
            return False
        records = [r for s in steps for r in s]
        return all(r is not None and not r.threads_alive and not r.pending_run
                   and not (r.vllm_exec and r.vllm_exec.leftovers) for r in records)

    def _regroup(self) -> bool:
        """A soft rebuild: the ranks leave the failed group for a fresh one on torchrun's
        store, under a prefix of their own, and drop what they built over the old one."""
        self.regroups += 1
        self._send_to_all(("regroup", self.regroups, self.timeouts.collective_s))
        deadline = time.monotonic() + self.timeouts.startup_deadline_s
        for rank, channel in self._channels.items():
            try:
                message = channel.recv(timeout_s=max(0.1, deadline - time.monotonic()))
            except (ChannelClosed, TimeoutError):
                return False
            if message != ("regrouped", rank):
                return False
        self._clean_captures.clear()
        return True

    def run_many(self, scenarios: Iterable[Scenario],
                 batch_size: int = BATCH_SIZE) -> Iterator[ScenarioHistory]:
        """Every scenario's history, in order; fault-free ones of a config already captured
        go several per round trip while the caller judges earlier ones."""
        return run_batched(self, scenarios, batch_size)

    def clean_capture(self, config) -> tuple[StartupRecord, ...] | None:
        """Every rank's start-up records of `config`, if this launch captured it cleanly."""
        return self._clean_captures.get((self.launches, config)) if self._channels else None

    def _collect(self, scenario: Scenario):
        n = self.nproc
        startup: list[StartupRecord | None] = [None] * n
        steps: list[list[StepRecord | None]] = []
        done: set[int] = set()
        lost: dict[int, StepError] = {}
        crashes: dict[int, str] = {}  # rank -> the traceback a crashing worker sent
        deadline = {r: time.monotonic() + self.timeouts.startup_deadline_s for r in range(n)}
        selector = selectors.DefaultSelector()
        for rank, channel in self._channels.items():
            selector.register(channel, selectors.EVENT_READ, rank)
        try:
            while len(done | set(lost)) < n:
                waiting = [r for r in range(n) if r not in done and r not in lost]
                wait = max(0.0, min(deadline[r] for r in waiting) - time.monotonic())
                ready = selector.select(timeout=wait)
                if not ready:
                    late = [r for r in waiting if time.monotonic() >= deadline[r]]
                    if late:
                        _open_hung_step(scenario, startup, steps, n)
                        evidence = self._hang_evidence(late, steps)
                        return startup, _up_to_first_failure(steps), evidence
                    continue
                for key, _ in ready:
                    rank = key.data
                    try:
                        message = key.fileobj.recv(timeout_s=self.timeouts.collective_s)
                    except (ChannelClosed, TimeoutError):
                        selector.unregister(key.fileobj)
                        lost[rank] = _lost_error(rank, scenario, self._trace_dir_of(rank))
                        self._send_to_all(("next", False))  # the survivors stop after it
                        continue
                    deadline[rank] = time.monotonic() + self.timeouts.step_deadline_s + 5.0
                    if message[0] == "startup":
                        startup[rank] = message[1]
                        if all(r is not None for r in startup):
                            self._send_go(startup)
                    elif message[0] == "step":
                        index, record = message[1], message[2]
                        while len(steps) <= index:
                            steps.append([None] * n)
                        steps[index][rank] = record
                        if all(r is not None for r in steps[index]):
                            self._send_to_all(("next", not step_failed(steps[index])))
                    elif message[0] == "done":
                        done.add(rank)
                    elif message[0] == "agent-lost":  # multi-node: its node's agent died
                        selector.unregister(key.fileobj)
                        lost[rank] = self._agent_lost(rank, message[2])
                        self._send_to_all(("next", False))
                    elif message[0] == "crash":
                        selector.unregister(key.fileobj)
                        lost[rank] = StepError("RankLost", "crashed", None, ErrorOrigin.LOST)
                        crashes[rank] = message[2]
                        self._send_to_all(("next", False))
        finally:
            selector.close()
        if not lost:
            return startup, steps, ""
        if startup_complete := all(r is not None for r in startup):
            self._record_lost(lost, steps)
        evidence = "\n".join(f"rank {r} {error.message}"
                             + (f":\n{crashes[r]}" if r in crashes else "")
                             for r, error in sorted(lost.items()))
        return startup, _up_to_first_failure(steps) if startup_complete else [], evidence

    def _send_go(self, startup) -> None:
        self._send_to_all(("steps", steps_may_run(startup)))

    def _send_to_all(self, message) -> None:
        for channel in self._channels.values():
            try:
                channel.send(message)
            except ChannelClosed:
                pass  # a lost rank shows up in the collection loop

    def _record_lost(self, lost: dict[int, StepError], steps) -> None:
        """A rank gone mid-scenario gets a failed record at the step it never finished."""
        for rank, error in lost.items():
            index = next((i for i, s in enumerate(steps) if s[rank] is None), len(steps))
            if index == len(steps):
                steps.append([None] * self.nproc)
            steps[index][rank] = StepRecord.failed(
                rank, index, error,
                injected_fault=error.origin in (ErrorOrigin.KILLED, ErrorOrigin.INJECTED))

    def _hang_evidence(self, late: list[int], steps) -> str:
        return self._rank_evidence(f"ranks {late} missed their deadline at step "
                                   f"{max(len(steps) - 1, 0)}")

    def _rank_evidence(self, headline: str) -> str:
        return rank_evidence(headline, self._dir, self._pids, self.nproc)

    def _log_tail(self) -> str:
        log = self._dir / "torchrun.log" if self._dir else None
        return log.read_text(errors="replace")[-2000:] if log and log.exists() else ""


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
        log = trace_dir / "torchrun.log"
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


