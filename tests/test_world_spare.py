"""A torchrun world that failed boots its replacement at once (a spare) and takes it at the
next start; a spare nobody took is stopped with the world
(harness/world/torchrun/agent_launch.py)."""

from __future__ import annotations

import psutil
import pytest

from harness.scenario import scenario_from_dict
from harness.timeouts import Timeouts
from harness.world.torchrun.world import TorchrunWorld

pytestmark = pytest.mark.dist

TIMEOUTS = Timeouts(collective_s=2.0, hang_s=4.0, step_deadline_s=8.0)
SMALL = {"capture_sizes": [16, 32], "max_num_reqs": 32, "max_num_batched_tokens": 64,
         "decode_threshold": 8, "prefill_threshold": 16}


def case(faults: list):
    return scenario_from_dict({"name": "spare", "config": SMALL, "faults": faults,
                               "steps": [{"ranks": [20, 24]}] * 2})


KILL = [{"kind": "kill_rank", "rank": 1, "step": 1}]


def processes_of(agent_pid: int) -> list[int]:
    return [agent_pid] + [c.pid for c in psutil.Process(agent_pid).children(recursive=True)]


def test_a_failed_world_is_replaced_by_the_spare_that_booted_while_the_driver_judged():
    world = TorchrunWorld(2, "gloo", TIMEOUTS, spares=1)
    seen: list[int] = []
    try:
        world.start()
        assert world.rig.spare is None  # no failure yet: nothing booted for nothing
        assert world.run(case(KILL)).steps[1][1].error.kind == "RankKilled"
        assert not world.alive and world.rig.spare is not None
        spare_agent = world.rig.spare.proc.pid
        assert all(r.error is None for r in world.run(case([])).steps[1])
        assert world.agent_pid == spare_agent  # the spare, not a fresh launch
        assert world.rig.spare is not None and world.rig.spare.proc.pid != spare_agent
        seen = processes_of(world.agent_pid) + processes_of(world.rig.spare.proc.pid)
        assert len(seen) >= 4  # the live agent and ranks; the spare's agent (ranks may be late)
    finally:
        assert world.close() == []
    assert not [p for p in seen if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_a_world_without_spares_boots_nothing_ahead():
    world = TorchrunWorld(2, "gloo", TIMEOUTS, spares=0)
    try:
        world.start()
        world.run(case(KILL))
        assert not world.alive and world.rig.spare is None
    finally:
        assert world.close() == []
