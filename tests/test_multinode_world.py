"""The torchrun world over two nodes on loopback (two torchrun agents, c10d rendezvous, one
DP world of 2 x 2 ranks): it runs, it rebuilds after a failure through torchrun's restarts,
a node whose agent is killed mid-run is named NodeLost, and nothing outlives it."""

from __future__ import annotations

import os
import signal
import threading

import psutil
import pytest
from process_watch import gone_within

from harness.check.judge import judge
from harness.errors import ConfigError
from harness.scenario import scenario_from_dict
from harness.timeouts import Timeouts
from harness.world.channel.wire import CONTROL_KEY_ENV
from harness.world.multinode.nodes import node_spec, shared_control_key

TIMEOUTS = Timeouts(collective_s=3.0, hang_s=5.0, step_deadline_s=10.0)
SMALL = {"capture_sizes": [16, 32], "max_num_reqs": 32, "max_num_batched_tokens": 64,
         "decode_threshold": 8, "prefill_threshold": 16}
GRACE_S = 15.0
LONG_RUN_STEPS = 150  # seconds of steps on the 2-core machine, so a kill lands mid-run


def scenario(faults=(), steps: int = 2):
    return scenario_from_dict({"name": faults[0]["kind"] if faults else "clean",
                               "config": SMALL, "steps": [{"ranks": [20, 24, 20, 24]}] * steps,
                               "faults": list(faults)})


@pytest.mark.parametrize("args, field", [
    ((1, 0, "127.0.0.1:5"), "nnodes"),
    ((2, 2, "127.0.0.1:5"), "node_rank"),
    ((2, 1, None), "rdzv_endpoint"),
    ((2, 1, "127.0.0.1"), "rdzv_endpoint"),
    ((2, 1, "127.0.0.1:99999"), "rdzv_endpoint"),
])
def test_multi_node_flags_are_checked_and_name_the_field(args, field):
    with pytest.raises(ConfigError) as exc:
        node_spec(*args)
    assert exc.value.field == field


def test_a_multi_node_world_takes_its_key_from_the_environment_only(monkeypatch):
    monkeypatch.delenv(CONTROL_KEY_ENV, raising=False)
    with pytest.raises(ConfigError) as exc:
        shared_control_key()
    assert exc.value.field == "control_key"
    monkeypatch.setenv(CONTROL_KEY_ENV, "ab" * 32)
    assert shared_control_key() == bytes.fromhex("ab" * 32)




@pytest.fixture
def two_nodes(request):
    if request.config.getoption("--nnodes") < 2:
        pytest.skip("two torchrun agents on loopback: run under make test-dp NNODES=2")
    from harness.world.multinode.loopback import loopback_multi_node_world

    world = loopback_multi_node_world(2, 2, TIMEOUTS)
    yield world
    world.close()


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_two_agents_on_loopback_make_one_dp_world_that_rebuilds_after_a_killed_rank(
        two_nodes):
    assert judge(two_nodes.run(scenario())).ok
    assert sorted(two_nodes.rig.node_of().items()) == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert len(set(two_nodes.rig.agent_pids().values())) == 2
    first = dict(two_nodes.rank_pids)
    # A rank of the other node is killed: named, and the world is rebuilt by torchrun.
    killed = two_nodes.run(scenario([{"kind": "kill_rank", "rank": 3, "step": 1}]))
    # An injected kill is the scenario's own fault: the verdict holds, the evidence names it.
    assert "rank 3 was killed (injected kill_rank)" in killed.evidence
    assert judge(two_nodes.run(scenario())).ok
    assert two_nodes.launches >= 2
    assert not set(first.values()) & set(two_nodes.rank_pids.values())  # fresh workers
    assert gone_within(first.values(), GRACE_S) == []
    agents = list(two_nodes.rig.agent_pids().values())
    workers = list(two_nodes.rank_pids.values())
    launchers = [two_nodes.agent_pid, *two_nodes.rig.node_launchers()]
    assert two_nodes.close() == []
    assert gone_within(agents + workers + launchers, GRACE_S) == []


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_a_node_whose_agent_is_killed_mid_run_is_named_and_nothing_outlives_the_world(
        two_nodes):
    assert judge(two_nodes.run(scenario())).ok
    # The other node's agent: the one its node launcher (not this driver's) started.
    launchers = set(two_nodes.rig.node_launchers())
    node, other = next((n, pid) for n, pid in two_nodes.rig.agent_pids().items()
                       if psutil.Process(pid).ppid() in launchers)
    own = [two_nodes.agent_pid, *(p for p in two_nodes.rig.agent_pids().values() if p != other)]
    workers = list(two_nodes.rank_pids.values())
    # No fault of the scenario's own: a long run, and the other node's agent dies in it.
    killer = threading.Timer(1.0, os.kill, (other, signal.SIGKILL))
    killer.start()
    try:
        history = two_nodes.run(scenario(steps=LONG_RUN_STEPS))
    finally:
        killer.cancel()
    errors = {r.rank: r.error for step in history.steps for r in step
              if r is not None and r.error is not None}
    # A rank of the dead node may see its sibling's collective fail before it sees its
    # agent gone; at least one says the node died, naming it.
    named = [e for r, e in errors.items() if e.kind == "NodeLost"]
    assert named and all(f"node {node}," in e.message for e in named), errors
    verdict = next(v for _, v in judge(history).failed_verdicts() if v.checker == "errors")
    assert "NodeLost" in verdict.detail, verdict.detail
    assert two_nodes.close() == []
    assert gone_within([*own, other, *workers, *launchers], GRACE_S) == []
