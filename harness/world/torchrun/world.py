"""The torchrun world: N persistent rank processes launched by torchrun, fed by this driver.

One torchrun job per world; it lives across many scenarios and is rebuilt only after a
failure (a hang, a crash, a killed rank). Every wait is bounded; on a missed deadline the
driver collects every rank's Python stacks and last collective, ends the world through its
rig (harness/world/torchrun/rig.py: one node's agent, or several nodes'), checks that no process of
the world survives, and reports the evidence.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from harness.errors import ConfigError, HarnessCannot
from harness.history.records import StartupRecord
from harness.history.scenario_history import ScenarioHistory, step_failed, steps_may_run
from harness.scenario import Scenario
from harness.timeouts import DEFAULT_TIMEOUTS, Timeouts
from harness.world.channel.links import RankLinks
from harness.world.channel.messages import Regroup, Regrouped, RunScenario
from harness.world.channel.wire import ChannelClosed
from harness.world.lifecycle_clock import LifecycleClock
from harness.world.torchrun.agent_launch import STOP_TIMEOUT_S
from harness.world.torchrun.backends import check_backend, rank_device
from harness.world.torchrun.batches import BATCH_SIZE, run_batched
from harness.world.torchrun.collect import collect_scenario
from harness.world.torchrun.launch import LAUNCH_TIMEOUT_S, Formation, WorldError
from harness.world.torchrun.local_agent import LocalAgent
from harness.world.torchrun.rig import Rig
from harness.world.vllm_slots import register_vllm_code

__all__ = ["LAUNCH_TIMEOUT_S", "STOP_TIMEOUT_S", "TorchrunWorld", "WorldError"]

# Spares of a world that imports vLLM's code, booted from its start on any machine: a hunt's
# first hang is rerun at once, so a hang and its rerun each find a world ready. On CUDA a
# launch imports vLLM again (20-45 s on a loaded 2-core machine); CPU ranks are forked from
# the world's zygote, so a spare costs little more than torchrun's agent (2.5 s of CPU).
VLLM_SPARES = 2


class TorchrunWorld:
    def __init__(self, nproc: int, backend: str = "gloo",
                 timeouts: Timeouts = DEFAULT_TIMEOUTS, device: str | None = None,
                 spares: int | None = None, preload_vllm: bool = False,
                 rig: Rig | None = None) -> None:
        """`rig`: what brings the ranks up (default: one torchrun agent on this node, with
        `spares` launches booting beside it; harness/world/multinode/world.py has another)."""
        register_vllm_code()  # the driver judges what its ranks ran
        self.layout = check_backend(backend, nproc, device)
        self.nproc = nproc
        self.backend = backend
        self.device = rank_device(backend, device)
        # Real graphs over NCCL on CUDA; gloo's CUDA collectives cannot be captured.
        self.graphs = "cuda" if backend == "nccl" else "emulated"
        # After a failed step an NCCL rank also waits, bounded, for its device.
        self.timeouts = timeouts.with_device_fence() if backend == "nccl" else timeouts
        self.preload_vllm = preload_vllm
        self.regroups = 0  # failures the same rank processes survived with a fresh group
        self.clock = LifecycleClock()
        self.links = RankLinks()
        self.formation = Formation(nproc)
        if spares is None and preload_vllm:
            spares = VLLM_SPARES
        self.rig: Rig = rig if rig is not None else LocalAgent(
            nproc, backend, self.device, self.layout, spares, preload_vllm)
        # (launch, config) -> every rank's start-up records, for configs this launch captured
        # cleanly: only those go in batches (harness/world/torchrun/batches.py).
        self._clean_captures: dict[tuple, tuple[StartupRecord, ...]] = {}

    # -- life cycle ---------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self.rig.alive

    @property
    def agent_pid(self) -> int | None:
        return self.rig.agent_pid

    @property
    def rank_pids(self) -> dict[int, int]:
        """Each connected rank's worker pid (empty between launches)."""
        return self.links.pids

    @property
    def launches(self) -> int:
        return self.formation.launches

    @property
    def listening_port(self) -> int | None:
        """The control port while workers connect."""
        return self.formation.listening_port

    @property
    def strangers_dropped(self) -> int:
        """Connections that failed the handshake, over all launches."""
        return self.formation.strangers_dropped

    def __enter__(self) -> TorchrunWorld:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def start(self) -> None:
        self._clean_captures.clear()
        with self.clock.timing(self.clock.starts):
            self.rig.start(self.links, self.formation, self.timeouts)

    def end_world(self, at_once: bool = False) -> list[int]:
        """End the world after a failure; the pids of it still alive (must be none). `at_once`:
        a rank was lost or late, so the rig does not wait for every rank to act on "exit"."""
        self._clean_captures.clear()
        with self.clock.timing(self.clock.ends):
            return self.rig.end_world(self.links, self.timeouts, at_once)

    def close(self) -> list[int]:
        """Stop the world (and its spare, or its nodes' agents). Returns the pids that were
        still alive at the end (must be empty)."""
        self._clean_captures.clear()
        return self.rig.close(self.links)

    # -- running scenarios -------------------------------------------------------------------

    def run(self, scenario: Scenario) -> ScenarioHistory:
        if scenario.config.serving.dp_size != self.nproc:
            raise ConfigError("dp_size", f"the scenario has {scenario.config.serving.dp_size} "
                              f"ranks but this world has {self.nproc}")
        if not self.alive or not len(self.links):  # multi-node agents outlive their worlds
            self.start()
        self.links.send_to_all(RunScenario(scenario.to_dict(), self.timeouts))
        try:
            startup, steps, evidence = collect_scenario(scenario, self.links, self.rig,
                                                        self.nproc, self.timeouts)
        except HarnessCannot:  # a rank's own harness code raised: no finding, a fresh world
            self.end_world()
            raise
        failed = not steps_may_run(startup) or any(step_failed(s) for s in steps)
        if not evidence and steps_may_run(startup):
            self._clean_captures[(self.launches, scenario.config)] = tuple(startup)
        if failed and not evidence and self._may_regroup(startup, steps):
            with self.clock.timing(self.clock.regroups):
                # Every rank shows where it stands (stacks, last collectives) first.
                shown = self.rig.rank_evidence(
                    "a rank failed; the same ranks formed a fresh group", self.links)
                regrouped = self._regroup()
            if regrouped:
                return ScenarioHistory(scenario, self.timeouts, tuple(startup),
                                       tuple(tuple(s) for s in steps), shown)
        if evidence or failed:
            # A timed-out or broken collective leaves the groups unusable: fresh world next,
            # once every rank still alive has shown where it stands.
            lost_or_late = bool(evidence)
            if not evidence:
                evidence = self.rig.rank_evidence("a rank failed; the world is rebuilt",
                                                  self.links)
            survivors = self.end_world(at_once=lost_or_late)
            if survivors:
                evidence += f"\nprocesses still alive after the kill: {survivors}"
        return ScenarioHistory(scenario, self.timeouts, tuple(startup),
                               tuple(tuple(s) for s in steps), evidence)

    def _may_regroup(self, startup, steps) -> bool:
        """A failure every rank survived on gloo, with no thread or run left behind: a
        fresh group in the same processes costs well under a second, a relaunch seconds."""
        if not self.rig.soft_rebuilds or self.backend != "gloo":
            return False
        records = [r for s in steps for r in s]
        if any(r is None for r in [*startup, *records]) or \
                any(r.vllm_exec and r.vllm_exec.leftovers for r in records):
            return False
        # A rank whose device is still held by a collective touches it no more: relaunch.
        if any(r.error is not None and r.error.kind == "DeviceWedged" for r in records):
            return False
        return not any(r.threads_alive or r.pending_run for r in [*startup, *records])

    def _regroup(self) -> bool:
        """A soft rebuild: the ranks leave the failed group for a fresh one on torchrun's
        store, under a prefix of their own, and drop what they built over the old one."""
        self.regroups += 1
        self.links.send_to_all(Regroup(self.regroups, self.timeouts.collective_s))
        deadline = time.monotonic() + self.timeouts.startup_deadline_s
        for rank in self.links.ranks():
            try:
                message = self.links.recv(rank, max(0.1, deadline - time.monotonic()))
            except (ChannelClosed, TimeoutError):
                return False
            if message != Regrouped(rank):
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
        return self._clean_captures.get((self.launches, config)) if len(self.links) else None
