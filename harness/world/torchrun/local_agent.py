"""The rig of a one-node torchrun world: one torchrun agent per world, launched afresh (or
taken from a spare that booted beside the live world) after every failure. On a missed
deadline or a lost rank the world ends: "exit" to every rank, SIGTERM then SIGKILL to
torchrun, every worker left killed, and (on CUDA) no worker may still hold GPU memory."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

from harness.errors import ErrorOrigin
from harness.history.step_error import StepError
from harness.timeouts import Timeouts
from harness.world.channel.links import RankLinks
from harness.world.channel.messages import Exit, WorkerHello
from harness.world.evidence import rank_evidence
from harness.world.processes.lifecycle import kill_all, wait_or_signal
from harness.world.torchrun.agent_launch import (
    MAX_SPARES,
    STOP_TIMEOUT_S,
    AgentLaunch,
    launch_agent,
    spares_by_default,
)
from harness.world.torchrun.gpus import GpuLayout, pids_holding_gpu_memory
from harness.world.torchrun.launch import Formation, WorldError
from harness.world.torchrun.zygote_client import RankZygote
from harness.world.trace_layout import TraceLayout

TERM_GRACE_S = 2.0  # for torchrun to stop its workers on SIGTERM


class LocalAgent:
    # One host's ranks may form a fresh loopback group after a failure (not across nodes).
    soft_rebuilds = True

    def __init__(self, nproc: int, backend: str, device: str, layout: GpuLayout | None,
                 spares: int | None = None, preload_vllm: bool = False) -> None:
        self.nproc, self.backend, self.device, self.layout = nproc, backend, device, layout
        self.preload_vllm = preload_vllm
        self.rebuilds = 0  # worlds ended by a failure
        # Launches kept booting beside a world that has failed once (NCCL: several).
        self.spares = (spares_by_default(nproc, backend) if spares is None
                       else min(spares, MAX_SPARES))
        self._spares: list[AgentLaunch] = []  # oldest first: the likeliest to have booted
        self._proc: subprocess.Popen | None = None
        self._dir: Path | None = None
        # CPU ranks are forked from a zygote that imported torch (and vLLM) once; CUDA ranks
        # start as their own interpreters (a fork after CUDA's set-up is unusable).
        self.forks_ranks = device == "cpu"
        self._zygote: RankZygote | None = None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def agent_pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def zygote_pid(self) -> int | None:
        """The process the ranks are forked from (None: CUDA ranks, or none started yet)."""
        return self._zygote.proc.pid if self._zygote is not None else None

    @property
    def spare(self) -> AgentLaunch | None:
        """The launch booting beside the live world that is taken next, if any."""
        return self._spares[0] if self._spares else None

    def start(self, links: RankLinks, formation: Formation, timeouts: Timeouts) -> None:
        self._close_live(links)
        launch = self._take_spare() or self._launch(timeouts)
        if formation.launches == 0 and self.layout is not None:
            print(self.layout.describe(), file=sys.stderr, flush=True)
        self._proc, self._dir = launch.proc, launch.trace_dir
        try:
            formation.take_in(launch.server, links, self._launcher_alive, _no_more_to_say)
        except BaseException:
            self.close(links)
            raise
        if self.rebuilds or self.preload_vllm:  # vLLM worlds: their hunts fault often
            self._boot_spares(timeouts)  # a world that failed once is likely to again

    def _launch(self, timeouts: Timeouts) -> AgentLaunch:
        return launch_agent(self.nproc, [
            "--backend", self.backend, "--device", self.device,
            "--collective-timeout", str(timeouts.collective_s),
            *(["--preload-vllm"] if self.preload_vllm else [])], self._zygote_env())

    def _zygote_env(self) -> dict[str, str] | None:
        if not self.forks_ranks:
            return None
        if self._zygote is None or not self._zygote.alive:
            if self._zygote is not None:
                self._zygote.close()
            self._zygote = RankZygote(self.preload_vllm)
        return self._zygote.launch_env

    def _settle_forked(self) -> list[int]:
        """Ranks forked for launches whose shims are gone, reaped; those that would not die."""
        return self._zygote.settle() if self._zygote is not None else []

    def _boot_spares(self, timeouts: Timeouts) -> None:
        while len(self._spares) < self.spares:
            self._spares.append(self._launch(timeouts))

    def _take_spare(self) -> AgentLaunch | None:
        while self._spares:
            spare = self._spares.pop(0)
            if spare.alive:
                return spare
            spare.discard()
            self._settle_forked()
        return None

    def _launcher_alive(self) -> None:
        if not self.alive:
            raise WorldError(f"torchrun exited with {self._proc.returncode} before every "
                             "worker connected", self._log_tail())

    def end_world(self, links: RankLinks, timeouts: Timeouts, at_once: bool = False) -> list[int]:
        """End the world after a failure; its replacement boots now, while the driver judges.
        `at_once`: a rank lost or past its deadline cannot act on "exit", so torchrun is not
        given the grace to stop on it (a rank parked in vLLM's wait would use it all up)."""
        # NCCL ranks end without tearing their communicator down (it can hang), so the
        # grace buys nothing there but the wait for a wedged device (measured 2 s of 2.5).
        grace_s = 0.0 if at_once or self.backend == "nccl" else TERM_GRACE_S
        survivors = self._close_live(links, grace_s)
        self.rebuilds += 1
        self._boot_spares(timeouts)
        return survivors

    def close(self, links: RankLinks) -> list[int]:
        """Stop the world and its spare."""
        survivors = self._close_live(links)
        spares, self._spares = self._spares, []
        for spare in spares:
            survivors += spare.discard()
        if self._zygote is not None:
            survivors += self._settle_forked() + self._zygote.close()
            self._zygote = None
        return survivors

    def _close_live(self, links: RankLinks, grace_s: float = TERM_GRACE_S) -> list[int]:
        """Stop the live world: ask, then SIGTERM torchrun, then kill what is left."""
        links.send_to_all(Exit())
        if self._proc is not None:
            wait_or_signal(self._proc, grace_s, signal.SIGTERM)
            wait_or_signal(self._proc, STOP_TIMEOUT_S, signal.SIGKILL)
        pids = list(links.pids.values())
        survivors = kill_all(pids) + self._settle_forked()
        if self.device == "cuda":
            survivors += pids_holding_gpu_memory(pids)
        links.close()
        self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        return survivors

    def agent_lost(self, rank: int, agent_pid: int) -> StepError:
        return StepError("RankLost", f"lost its torchrun agent (pid {agent_pid})", None,
                         ErrorOrigin.LOST)

    def trace_dir_of(self, rank: int) -> Path | None:
        return self._dir

    def rank_evidence(self, headline: str, links: RankLinks) -> str:
        return rank_evidence(headline, self._dir, links.pids, self.nproc)

    def _log_tail(self) -> str:
        log = TraceLayout(self._dir).torchrun_log if self._dir else None
        tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
        zygote = self._zygote.log_tail() if self._zygote is not None else ""
        return tail + (f"\nthe rank zygote's log:\n{zygote}" if zygote else "")


def _no_more_to_say(hello: WorkerHello) -> None:
    """Of a worker on this one node, its rank and pid are all the driver keeps."""
