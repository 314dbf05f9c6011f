"""The default sim world, sandboxed: its rank threads run in a child process, so a rank that
aborts (gloo on a size-mismatched all-to-all, a segfault) ends as a named verdict instead of
ending the harness.

The runner process is persistent, like the in-process world it hosts: it keeps its groups
and captured graphs across scenarios and is forked again (from a zygote that imported torch
once, harness/world/sandbox/child.py) only after it died. Records come back as each step
ends, so a death mid-scenario keeps the steps before it. Every wait here is bounded; a runner
stuck past every bound of its own world is dumped (faulthandler) and killed. What the harness's
own code raised in the runner (a scenario it could not read, a runtime it could not build)
comes back typed (RunnerCannot) and is raised here as HarnessCannot: no finding, exit 3.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

from harness.config import DecisionSystem, HarnessConfig
from harness.errors import ConfigError, HarnessCannot, last_line
from harness.history.scenario_history import ScenarioHistory
from harness.scenario import Scenario
from harness.timeouts import DEFAULT_TIMEOUTS, Timeouts
from harness.world.channel.messages import (
    Exit,
    ForkRunner,
    LoadSystem,
    M,
    ProtocolError,
    ReapRunner,
    RunnerCannot,
    RunnerForked,
    RunnerHello,
    RunnerReaped,
    SimDone,
    SimRun,
    SimStartup,
    SimStep,
    SystemLoaded,
    ZygoteReady,
)
from harness.world.channel.wire import Channel, ChannelClosed, expect_hello
from harness.world.evidence import last_collective, native_abort_message
from harness.world.lifecycle_clock import LifecycleClock
from harness.world.processes.lifecycle import package_pythonpath, pid_alive
from harness.world.sandbox.crash import crashed_history, describe_exit
from harness.world.sim.world import refuse_threads_for_vllm_execution
from harness.world.trace_layout import TraceLayout
from harness.world.vllm_slots import register_vllm_code

ZYGOTE_START_S = 90.0  # an interpreter importing torch on a loaded machine
REPLY_S = 10.0  # the zygote answers a fork or a reap request
REAP_S = 2.0  # a runner whose channel closed has exited by then (else it is killed)
MARGIN_S = 10.0  # past the runner's own bounds before it counts as stuck
STACKS_WAIT_S = 1.0


class SandboxError(HarnessCannot):
    """The sandbox could not be started or answered out of turn: a world that would not start,
    in one line (what the zygote logged, or its traceback, is the detail)."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__("world", message, detail)


class Zygote:
    """The forking process every sandboxed sim world of this driver shares."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="dbo-zygote-"))
        mine, theirs = socket.socketpair()
        log = open(self._dir / "zygote.log", "wb")  # closed below
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "harness.world.sandbox.child", "--fd",
                 str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
                env=dict(os.environ, PYTHONPATH=package_pythonpath()))
        finally:
            theirs.close()
            log.close()
        self._sock = mine
        self.channel = Channel(Connection(os.dup(mine.fileno())))
        self.loaded: set[DecisionSystem] = {DecisionSystem.HARNESS}
        try:
            self._expect(ZygoteReady, ZYGOTE_START_S, hello=True)
        except BaseException:
            self.close()
            raise

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork(self, nproc: int, timeouts: Timeouts, trace_dir: Path) -> tuple[Channel, int]:
        """A fresh runner: its channel (a socket pair made here) and its pid."""
        mine, theirs = socket.socketpair()
        try:
            self.channel.send(ForkRunner(nproc, timeouts, str(trace_dir)))
            socket.send_fds(self._sock, [b"F"], [theirs.fileno()])
        except OSError as exc:
            mine.close()
            raise ChannelClosed(str(exc)) from exc
        finally:
            theirs.close()
        pid = self._expect(RunnerForked, REPLY_S).pid
        channel = Channel(Connection(os.dup(mine.fileno())))
        mine.close()
        return channel, pid

    def load(self, config: HarnessConfig) -> bool:
        """Load the decision code of `config`'s system in the zygote, once per system; True
        when this call loaded it (runners forked before lack it)."""
        if config.system.sut in self.loaded:
            return False
        self.channel.send(LoadSystem(config.to_dict()))
        failure = self._expect(SystemLoaded, ZYGOTE_START_S).failure
        if failure is not None:
            raise SandboxError(f"the sim world's zygote could not load {config.system.sut.value}'s "
                               f"decision code: {last_line(failure)}", failure)
        self.loaded.add(config.system.sut)
        return True

    def reap(self, pid: int) -> int | None:
        """The runner's exit code once it has ended (killed after REAP_S)."""
        self.channel.send(ReapRunner(pid, REAP_S))
        return self._expect(RunnerReaped, 2 * REAP_S + REPLY_S).exit_code

    def _expect(self, kind: type[M], timeout_s: float, hello: bool = False) -> M:
        """The zygote's answer; its hello first (of this protocol version, else a
        ProtocolError in one line)."""
        try:
            message = (expect_hello(self.channel, kind, timeout_s) if hello
                       else self.channel.recv(timeout_s=timeout_s))
        except (TimeoutError, ChannelClosed) as exc:
            raise SandboxError(f"the sim world's zygote did not answer {kind.__name__}: "
                               f"{exc}", self._log_tail()) from exc
        if not isinstance(message, kind):
            raise SandboxError(f"the sim world's zygote answered {type(message).__name__}, "
                               f"not {kind.__name__}")
        return message

    def _log_tail(self) -> str:
        log = self._dir / "zygote.log"
        return log.read_text(errors="replace")[-2000:] if log.exists() else ""

    def close(self) -> list[int]:
        """Stop the zygote (it kills its runners); the pids still alive after (none)."""
        try:
            self.channel.send(Exit())
        except ChannelClosed:
            pass
        self.channel.close()
        self._sock.close()
        try:
            self.proc.wait(timeout=REPLY_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            try:
                self.proc.wait(timeout=REPLY_S)
            except subprocess.TimeoutExpired:
                return [self.proc.pid]
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)
        return []


_zygote: Zygote | None = None
_users = 0


def _acquire_zygote() -> Zygote:
    global _zygote
    if _zygote is not None and not _zygote.alive:
        _zygote.close()  # reaps it and removes its directory
        _zygote = None
    if _zygote is None:
        _zygote = Zygote()
    return _zygote


def _release_zygote() -> list[int]:
    global _zygote, _users
    _users -= 1
    if _users > 0 or _zygote is None:
        return []
    zygote, _zygote = _zygote, None
    return zygote.close()


class SandboxedSimWorld:
    """The sim world behind the same interface, its ranks in a runner process of their own."""

    graphs = "emulated"

    def __init__(self, nproc: int, timeouts: Timeouts = DEFAULT_TIMEOUTS,
                 margin_s: float = MARGIN_S) -> None:
        global _users
        register_vllm_code()  # the driver judges what its runner ran
        self.nproc = nproc
        self.timeouts = timeouts
        self.margin_s = margin_s
        self.launches = 0  # runners forked so far (one more after every death)
        self.clock = LifecycleClock()  # each runner's fork and hello (the zygote starts before)
        self._dir = Path(tempfile.mkdtemp(prefix="dbo-sim-"))
        self._runner: tuple[Channel, int] | None = None
        self._zygote: Zygote | None = None
        _users += 1

    def __enter__(self) -> SandboxedSimWorld:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def _layout(self) -> TraceLayout:
        return TraceLayout(self._dir)

    @property
    def runner_pid(self) -> int | None:
        return self._runner[1] if self._runner else None

    def run(self, scenario: Scenario) -> ScenarioHistory:
        refuse_threads_for_vllm_execution(scenario.config)
        if scenario.config.serving.dp_size != self.nproc:
            raise ConfigError("dp_size", f"the scenario has {scenario.config.serving.dp_size} "
                              f"ranks but this world has {self.nproc}")
        self._load_system(scenario.config)
        channel, pid = self._ensure_runner()
        stderr = self._layout.runner_stderr
        mark = stderr.stat().st_size if stderr.exists() else 0
        try:
            channel.send(SimRun(scenario.to_dict()))
        except ChannelClosed:
            pass  # it died between scenarios: the reads below find out how
        startup, steps = None, []
        t = self.timeouts
        while True:
            # The bounds of the world inside (group set-up, runtimes, capture; a step), plus
            # a margin: past them the runner itself is stuck.
            bound = (t.sandbox_startup_wait_s if startup is None
                     else t.step_wait_s) + self.margin_s
            try:
                message = channel.recv(timeout_s=bound)
            except TimeoutError:
                return self._stuck(scenario, startup, steps, bound)
            except ChannelClosed:
                return self._died(scenario, startup, steps, mark)
            match message:
                case SimStartup(records):
                    startup = records
                case SimStep(_, records):
                    steps.append(records)
                case SimDone(retired):
                    if retired:  # the runner retires after a failure: reap it, fork anew
                        self._end_runner()
                    return ScenarioHistory(scenario, t, tuple(startup), tuple(steps))
                case RunnerCannot(what, line, traceback):
                    self._end_runner()  # it ends itself: a fresh one for the next scenario
                    raise HarnessCannot(what, line, traceback)

    def _load_system(self, config: HarnessConfig) -> None:
        # vLLM's imports take longer than a rank's deadline: loaded once in the zygote, so a
        # runner forked after a crash has them too.
        if _acquire_zygote().load(config) and self._runner is not None:
            self._end_runner()  # forked before the code was loaded

    def _ensure_runner(self) -> tuple[Channel, int]:
        if self._runner is None:
            with self.clock.timing(self.clock.starts):
                self._fork_runner()
        return self._runner

    def _fork_runner(self) -> None:
        """A runner forked from the zygote (started first if need be), saying hello."""
        self._zygote = _acquire_zygote()
        try:
            channel, pid = self._zygote.fork(self.nproc, self.timeouts, self._dir)
        except (ChannelClosed, SandboxError):  # the zygote died: one fresh start
            self._zygote = _acquire_zygote()
            channel, pid = self._zygote.fork(self.nproc, self.timeouts, self._dir)
        self.launches += 1
        self._runner = (channel, pid)
        try:
            hello = expect_hello(channel, RunnerHello, ZYGOTE_START_S)
        except ProtocolError:
            self._end_runner()
            raise
        except (TimeoutError, ChannelClosed) as exc:
            hello = exc
        if hello != RunnerHello(pid):
            code = self._end_runner()
            raise SandboxError(f"the sim world's runner did not start ({hello!r}; it "
                               f"ended with {describe_exit(code)})",
                               _read_from(self._layout.runner_stderr, 0)[-2000:])

    def _died(self, scenario, startup, steps, mark: int) -> ScenarioHistory:
        returncode = self._end_runner()
        last = {r: last_collective(self._dir, r) for r in range(self.nproc)}
        native_text = _read_from(self._layout.runner_stderr, mark)
        native = native_abort_message(native_text)
        index = "capture" if startup is None else f"step {len(steps)}"
        evidence = "\n".join([
            f"the sim world's process died of {describe_exit(returncode)} in {index}",
            *(f"rank {r} trace tail: {last[r] or 'none'}" for r in range(self.nproc)),
            f"--- stderr ---\n{native_text.strip() or '(nothing)'}",
            f"--- stacks ---\n{_read_from(self._layout.runner_stacks, 0).strip() or '(none)'}"])
        return crashed_history(scenario, self.timeouts, startup, steps, returncode, last,
                               native, evidence)

    def _stuck(self, scenario, startup, steps, bound: float) -> ScenarioHistory:
        """Past every bound of the world inside: its stacks, then a fresh runner next time."""
        stacks = self._layout.runner_stacks
        before = stacks.stat().st_size if stacks.exists() else 0
        try:
            os.kill(self._runner[1], signal.SIGUSR1)
            deadline = time.monotonic() + STACKS_WAIT_S
            while time.monotonic() < deadline and stacks.stat().st_size <= before:
                time.sleep(0.02)
        except (ProcessLookupError, FileNotFoundError):
            pass
        evidence = (f"the sim world's process sent nothing for {bound:.1f} s; it was killed\n"
                    + "\n".join(f"rank {r} trace tail: "
                                f"{last_collective(self._dir, r) or 'none'}"
                                for r in range(self.nproc))
                    + f"\n--- stacks ---\n{_read_from(stacks, before).strip() or '(none)'}")
        self._end_runner()
        none = (None,) * self.nproc
        if startup is None:
            return ScenarioHistory(scenario, self.timeouts, none, (), evidence)
        return ScenarioHistory(scenario, self.timeouts, tuple(startup),
                               (*map(tuple, steps), none), evidence)

    def _end_runner(self) -> int | None:
        """Close the runner's channel and reap it (killed if it lingers): its exit code."""
        if self._runner is None:
            return None
        channel, pid = self._runner
        self._runner = None
        channel.close()
        try:
            return self._zygote.reap(pid)
        except (SandboxError, ChannelClosed):
            return None

    def close(self) -> list[int]:
        """Stop the runner and, with the last world, the zygote; pids left alive (none)."""
        leftover: list[int] = []
        if self._runner is not None:
            pid = self._runner[1]
            if self._end_runner() is None and pid_alive(pid):
                leftover.append(pid)
        if self._dir is not None:
            leftover += _release_zygote()
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        return leftover


def _read_from(path: Path, offset: int) -> str:
    if not path.exists():
        return ""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(64_000).decode(errors="replace")
