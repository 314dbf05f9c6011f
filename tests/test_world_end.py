"""How a one-node torchrun world ends after a failure (harness/world/torchrun/local_agent.py):
torchrun gets a grace to stop on "exit", except where a rank was lost or missed its deadline,
which cannot act on it (a rank parked in vLLM's unbounded wait would use the grace up on every
hang a search meets)."""

from __future__ import annotations

import subprocess
import sys
import time

from harness.scenario import scenario_from_dict
from harness.timeouts import DEFAULT_TIMEOUTS
from harness.world.channel.links import RankLinks
from harness.world.torchrun import world as torchrun_world
from harness.world.torchrun.local_agent import TERM_GRACE_S, LocalAgent

SCENARIO = scenario_from_dict({"config": {"capture_sizes": [8]}, "steps": [{"ranks": [4, 4]}]})


def seconds_to_end(at_once: bool) -> float:
    """End a world whose agent never acts on "exit" (a sleeping process stands in for it)."""
    agent = LocalAgent(2, "gloo", "cpu", None, spares=0)
    agent._proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                   start_new_session=True)
    start = time.monotonic()
    assert agent.end_world(RankLinks(), DEFAULT_TIMEOUTS, at_once) == []
    assert not agent.alive
    return time.monotonic() - start


def test_an_agent_deaf_to_exit_gets_the_grace_unless_told_to_end_at_once():
    assert seconds_to_end(at_once=False) >= TERM_GRACE_S
    assert seconds_to_end(at_once=True) < TERM_GRACE_S


class _Rig:
    """A rig whose ranks are all up, noting how the world asked it to end."""

    soft_rebuilds, alive, agent_pid = False, True, None

    def __init__(self) -> None:
        self.ended: list[bool] = []

    def start(self, links, formation, timeouts) -> None:
        pass

    def end_world(self, links, timeouts, at_once=False) -> list[int]:
        self.ended.append(at_once)
        return []

    def rank_evidence(self, headline: str, links) -> str:
        return headline


def ended_with(monkeypatch, evidence: str) -> list[bool]:
    failed = [[None, None]]  # a step no rank reported: failed whatever the evidence
    monkeypatch.setattr(torchrun_world, "collect_scenario",
                        lambda *args: ([], failed, evidence))
    rig = _Rig()
    torchrun_world.TorchrunWorld(2, "gloo", DEFAULT_TIMEOUTS, rig=rig).run(SCENARIO)
    return rig.ended


def test_the_world_ends_at_once_only_where_a_rank_was_lost_or_late(monkeypatch):
    assert ended_with(monkeypatch, "ranks [1] missed their deadline at step 0") == [True]
    assert ended_with(monkeypatch, "") == [False]
