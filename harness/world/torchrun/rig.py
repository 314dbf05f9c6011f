"""What brings a torchrun world's ranks up and takes them down: the part that differs
between one node (an agent per world, harness/world/torchrun/local_agent.py) and several
(agents that outlive the worlds, harness/world/multinode/world.py). The world itself
(harness/world/torchrun/world.py) runs the scenarios over the links a rig fills."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from harness.history.step_error import StepError
from harness.timeouts import Timeouts
from harness.world.channel.links import RankLinks
from harness.world.torchrun.launch import Formation


class Rig(Protocol):
    # After a failure every rank survived, may the same ranks form a fresh group on their
    # store (one host's loopback group), instead of a relaunch?
    soft_rebuilds: bool

    @property
    def alive(self) -> bool:
        """What launches the ranks (this node's torchrun agent) still runs."""

    @property
    def agent_pid(self) -> int | None:
        """This node's torchrun agent (or the launcher it runs under); None when down."""

    def start(self, links: RankLinks, formation: Formation, timeouts: Timeouts) -> None:
        """Bring a fresh world up into `links` (WorldError, cleaned up, when it fails)."""

    def end_world(self, links: RankLinks, timeouts: Timeouts, at_once: bool = False) -> list[int]:
        """End the world after a failure; the pids of it still alive (must be none). `at_once`:
        a rank was lost or missed its deadline, so not every rank can act on "exit"."""

    def close(self, links: RankLinks) -> list[int]:
        """Stop everything; the pids still alive after (must be none)."""

    def agent_lost(self, rank: int, agent_pid: int) -> StepError:
        """The error of a rank whose worker saw its torchrun agent die."""

    def trace_dir_of(self, rank: int) -> Path | None:
        """Where the rank's stacks and collective trace lie, as this host sees it."""

    def rank_evidence(self, headline: str, links: RankLinks) -> str:
        """Every rank's stacks and trace tail under `headline`, read where they lie."""
