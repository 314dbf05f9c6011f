"""The torchrun world: N persistent rank processes launched by torchrun, fed by this driver.

One torchrun job per world; it lives across many scenarios and is rebuilt only after a
failure (a hang, a crash, a killed rank). Every wait is bounded; on a missed deadline the
driver collects every rank's Python stacks and last collective, terminates torchrun, kills
any worker left, checks that no process of the world survives, and reports the evidence.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from harness.check.checkers import check_startup
from harness.check.records import StartupRecord, StepError, StepRecord
from harness.errors import ConfigError
from harness.scenario import FaultKind, Scenario
from harness.world.control_server import ControlServer
from harness.world.gpus import GpuLayout, pids_holding_gpu_memory, visible_gpus
from harness.world.results import (
    DEFAULT_TIMEOUTS,
    ScenarioResult,
    Timeouts,
    judge,
    startup_lets_steps_run,
    step_failed,
)
from harness.world.wire import CONTROL_KEY_ENV, Channel, ChannelClosed, new_control_key

LAUNCH_TIMEOUT_S = 90.0  # torchrun start plus `import torch` in every worker
STOP_TIMEOUT_S = 10.0
STACKS_WAIT_S = 1.0  # for every rank to dump its stacks on SIGUSR1


class WorldError(RuntimeError):
    """The world could not be started (torchrun failed, or workers never connected)."""


def check_backend(backend: str, nproc: int, device: str | None = None) -> GpuLayout | None:
    """One clear line for a world that cannot run here (no silent fallback, no skip); the
    GPU layout of an NCCL world. `device` None means the backend's own: cuda for nccl."""
    if backend not in ("gloo", "nccl"):
        raise ConfigError("backend", f"unknown backend {backend!r} (gloo or nccl)")
    device = device or ("cuda" if backend == "nccl" else "cpu")
    if device not in ("cpu", "cuda"):
        raise ConfigError("device", f"unknown device {device!r} (cpu or cuda)")
    if nproc < 2:
        raise ConfigError("nproc", f"is {nproc}; a DP world needs at least 2 ranks")
    if backend == "nccl":
        if device != "cuda":
            raise ConfigError("device", "nccl runs on cuda; use --device cuda or gloo")
        return GpuLayout(nproc, visible_gpus())
    if device == "cuda" and visible_gpus() == 0:
        raise ConfigError("device", "cuda: no GPU is visible here; use DEVICE=cpu")
    return None


class TorchrunWorld:
    def __init__(self, nproc: int, backend: str = "gloo",
                 timeouts: Timeouts = DEFAULT_TIMEOUTS, device: str | None = None) -> None:
        self.layout = check_backend(backend, nproc, device)
        self.nproc = nproc
        self.backend = backend
        self.device = "cuda" if backend == "nccl" else (device or "cpu")
        # Real graphs over NCCL on CUDA; gloo's CUDA collectives cannot be captured.
        self.graphs = "cuda" if backend == "nccl" else "emulated"
        # After a failed step an NCCL rank also waits, bounded, for its device.
        self.timeouts = timeouts.with_device_fence() if backend == "nccl" else timeouts
        self.launches = 0
        self._proc: subprocess.Popen | None = None
        self._channels: dict[int, Channel] = {}
        self.listening_port: int | None = None  # the control port while workers connect
        self.strangers_dropped = 0  # connections that failed the handshake, over all launches
        self._pids: dict[int, int] = {}
        self._dir: Path | None = None

    # -- life cycle ---------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> TorchrunWorld:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def start(self) -> None:
        self.close()
        self._dir = Path(tempfile.mkdtemp(prefix="dbo-world-"))
        key = new_control_key()  # fresh per world; reaches the workers by environment only
        server = ControlServer(key)
        self.listening_port = server.port
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={self.nproc}", "--max-restarts=0",
               "-m", "harness.world.worker", "--control", f"127.0.0.1:{server.port}",
               "--driver-pid", str(os.getpid()), "--trace-dir", str(self._dir),
               "--backend", self.backend, "--device", self.device,
               "--collective-timeout", str(self.timeouts.collective_s)]
        log = open(self._dir / "torchrun.log", "wb")  # noqa: SIM115 - closed with the world
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=_pythonpath(),
                   **{CONTROL_KEY_ENV: key.hex()})
        if self.launches == 0 and self.layout is not None:
            print(self.layout.describe(), file=sys.stderr, flush=True)
        self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True)
        self.launches += 1
        try:
            self._accept(server)
        except BaseException:
            self.close()
            raise
        finally:
            self.strangers_dropped += server.dropped
            server.close()
            self.listening_port = None

    def _accept(self, server: ControlServer) -> None:
        """Every worker, authenticated, says hello, then that it joined the group."""
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S

        def launcher_alive() -> None:
            if not self.alive:
                raise WorldError(f"torchrun exited with {self._proc.returncode} before every "
                                 f"worker connected:\n{self._log_tail()}")

        while len(self._channels) < self.nproc:
            try:
                channel = server.accept(deadline, launcher_alive)
            except TimeoutError:
                raise WorldError(f"only {len(self._channels)} of {self.nproc} workers "
                                 f"connected within {LAUNCH_TIMEOUT_S:.0f} s") from None
            hello = channel.recv(timeout_s=30)
            _, rank, pid = hello
            self._channels[rank], self._pids[rank] = channel, pid
        for rank, channel in self._channels.items():
            message = channel.recv(timeout_s=max(1.0, deadline - time.monotonic()))
            if message[0] != "ready":
                raise WorldError(f"rank {rank} failed to join the process group:\n"
                                 f"{message[-1]}")

    def close(self) -> list[int]:
        """Stop the world: ask, then SIGTERM torchrun, then kill what is left. Returns the
        pids that were still alive at the end (must be empty)."""
        for channel in self._channels.values():
            try:
                channel.send(("exit",))
            except ChannelClosed:
                pass
        if self._proc is not None:
            _wait_or(self._proc, 2.0, signal.SIGTERM)
            _wait_or(self._proc, STOP_TIMEOUT_S, signal.SIGKILL)
        survivors = _kill_all(list(self._pids.values()))
        if self.device == "cuda":
            survivors += pids_holding_gpu_memory(list(self._pids.values()))
        for channel in self._channels.values():
            channel.close()
        self._channels, self._pids, self._proc = {}, {}, None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        return survivors

    def worker_pids(self) -> list[int]:
        return list(self._pids.values())

    # -- running scenarios -------------------------------------------------------------------

    def run(self, scenario: Scenario) -> ScenarioResult:
        if scenario.config.dp_size != self.nproc:
            raise ConfigError("dp_size", f"the scenario has {scenario.config.dp_size} ranks "
                              f"but this world has {self.nproc}")
        if not self.alive:
            self.start()
        for channel in self._channels.values():
            channel.send(("run", scenario.to_dict(), asdict(self.timeouts)))
        startup, steps, evidence = self._collect(scenario)
        failed = (any(r is None or r.error is not None for r in startup)
                  or any(step_failed(s) for s in steps))
        if evidence or failed:
            # A timed-out or broken collective leaves the groups unusable: fresh world next,
            # once every rank still alive has shown where it stands.
            if not evidence:
                evidence = self._rank_evidence("a rank failed; the world is rebuilt")
            survivors = self.close()
            if survivors:
                evidence += f"\nprocesses still alive after the kill: {survivors}"
        return judge(scenario, startup, steps, self.timeouts, evidence)

    def _collect(self, scenario: Scenario):
        n = self.nproc
        startup: list[StartupRecord | None] = [None] * n
        steps: list[list[StepRecord | None]] = []
        done: set[int] = set()
        lost: dict[int, str] = {}
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
                        evidence = self._hang_evidence(late, steps)
                        return startup, _up_to_first_failure(steps), evidence
                    continue
                for key, _ in ready:
                    rank = key.data
                    try:
                        message = key.fileobj.recv(timeout_s=self.timeouts.collective_s)
                    except (ChannelClosed, TimeoutError):
                        selector.unregister(key.fileobj)
                        lost[rank] = self._why_lost(rank, scenario)
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
                    elif message[0] == "crash":
                        selector.unregister(key.fileobj)
                        lost[rank] = f"crashed:\n{message[2]}"
                        self._send_to_all(("next", False))
        finally:
            selector.close()
        if not lost:
            return startup, steps, ""
        if startup_complete := all(r is not None for r in startup):
            self._record_lost(lost, steps)
        evidence = "\n".join(f"rank {r} {why}" for r, why in sorted(lost.items()))
        return startup, _up_to_first_failure(steps) if startup_complete else [], evidence

    def _send_go(self, startup) -> None:
        go = startup_lets_steps_run(check_startup(startup, self.timeouts.startup_deadline_s))
        self._send_to_all(("steps", go))

    def _send_to_all(self, message) -> None:
        for channel in self._channels.values():
            try:
                channel.send(message)
            except ChannelClosed:
                pass  # a lost rank shows up in the collection loop

    def _why_lost(self, rank: int, scenario: Scenario) -> str:
        killed = any(f.kind is FaultKind.KILL_RANK and f.rank == rank for f in scenario.faults)
        return ("was killed (injected kill_rank)" if killed
                else "lost its process (ended by torchrun after a peer died, or crashed)")

    def _record_lost(self, lost: dict[int, str], steps) -> None:
        """A rank gone mid-scenario gets a failed record at the step it never finished."""
        for rank, why in lost.items():
            index = next((i for i, s in enumerate(steps) if s[rank] is None), len(steps))
            if index == len(steps):
                steps.append([None] * self.nproc)
            killed = why.startswith("was killed")
            error = StepError("RankKilled" if killed else "RankLost", why.splitlines()[0])
            steps[index][rank] = StepRecord(
                rank=rank, step=index, plan=None, executed="failed", captured_split=(),
                replay_split=(), fingerprint=(), routes=(), outputs=(), state=(),
                threads_alive=(), pending_run=False, error=error,
                injected_fault=killed, seconds=0.0)

    def _hang_evidence(self, late: list[int], steps) -> str:
        return self._rank_evidence(f"ranks {late} missed their deadline at step "
                                   f"{max(len(steps) - 1, 0)}")

    def _rank_evidence(self, headline: str) -> str:
        """Stacks of every rank (faulthandler) and the collective each was last in."""
        stacks = {rank: self._dir / f"stacks-{rank}.txt" for rank in range(self.nproc)}
        before = {rank: _size(path) for rank, path in stacks.items()}
        asked = []
        for rank, pid in self._pids.items():
            try:
                os.kill(pid, signal.SIGUSR1)
                asked.append(rank)
            except ProcessLookupError:
                pass
        # faulthandler writes from its signal handler, GIL or not; give it a moment.
        deadline = time.monotonic() + STACKS_WAIT_S
        while (time.monotonic() < deadline
               and any(_size(stacks[r]) <= before[r] for r in asked)):
            time.sleep(0.02)
        time.sleep(0.05)  # the last lines of a dump that has begun
        lines = [headline]
        for rank in range(self.nproc):
            trace = self._dir / f"collectives-{rank}.txt"
            tail = trace.read_text().splitlines()[-2:] if trace.exists() else []
            lines.append(f"rank {rank} trace tail: {' | '.join(tail) or 'none'}")
        for rank in range(self.nproc):
            stack = self._dir / f"stacks-{rank}.txt"
            text = stack.read_text() if stack.exists() else ""
            lines.append(f"--- rank {rank} stacks ---\n{text.strip() or '(none dumped)'}")
        return "\n".join(lines)

    def _log_tail(self) -> str:
        log = self._dir / "torchrun.log" if self._dir else None
        return log.read_text(errors="replace")[-2000:] if log and log.exists() else ""


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _up_to_first_failure(steps):
    """Steps past the first failed one are partial (ranks stop after a failure)."""
    first = next((i for i, s in enumerate(steps) if step_failed(s)), None)
    return steps if first is None else steps[:first + 1]


def _pythonpath() -> str:
    root = str(Path(__file__).resolve().parents[2])
    existing = os.environ.get("PYTHONPATH")
    return f"{root}{os.pathsep}{existing}" if existing else root


def _wait_or(proc: subprocess.Popen, timeout_s: float, sig: int) -> None:
    try:
        proc.wait(timeout=timeout_s)
        return
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass


def _kill_all(pids: list[int]) -> list[int]:
    """SIGKILL every pid still alive (workers run in their own sessions), then confirm."""
    import psutil

    alive = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            proc.kill()
            proc.wait(timeout=5)
        except psutil.NoSuchProcess:
            continue
        except psutil.TimeoutExpired:
            alive.append(pid)
    return [pid for pid in alive if psutil.pid_exists(pid)]
