"""The two-node lane (`make test-multinode`) fails when either node fails, stops the other,
and passes only when both end cleanly; a node whose driver ended the world on purpose exits 0
however its agent went, and only then."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from harness.world.channel.wire import CONTROL_KEY_ENV, new_control_key
from harness.world.multinode.heartbeat import DriverBeat, DriverWatch, clear_end_mark
from harness.world.multinode.lane import main as lane_main
from harness.world.multinode.lane import stop, watch
from harness.world.multinode.loopback import free_loopback_port
from harness.world.multinode.node import node_exit
from harness.world.multinode.nodes import hosts_rendezvous, node_spec

ROOT = Path(__file__).resolve().parents[1]

FOREVER = "import time; time.sleep(600)"


def process(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                            start_new_session=True)


def exits(code: int) -> str:
    return f"import sys; sys.exit({code})"


@pytest.mark.parametrize("driver, node, code, line", [
    (exits(0), exits(0), 0, "the driver passed and node 1 ended cleanly"),
    (exits(1), FOREVER, 1, "the driver (pytest, node 0) exited 1"),
    (exits(4), exits(0), 4, "the driver (pytest, node 0) exited 4"),
    (FOREVER, exits(3), 1, "node 1 exited 3 before the driver ended"),
    (exits(0), f"import time; time.sleep(0.5); {exits(3)}", 1,
     "node 1 exited 3 after the driver passed"),
    (exits(0), FOREVER, 1, "node 1 still ran 1 s after the driver passed"),
    (FOREVER, FOREVER, 1, "the lane ran past 3 s: both nodes stopped"),
], ids=["both-clean", "driver-fails", "driver-usage", "node-dies-first", "node-fails-after",
        "node-lingers", "bound"])
def test_the_lane_passes_only_when_the_driver_passes_and_node_1_ends_cleanly(
        driver, node, code, line):
    procs = [process(driver), process(node)]
    try:
        end = watch(procs[0], procs[1], seconds=3.0, grace_s=1.0)
    finally:
        for proc in procs:
            stop(proc)
    assert (end.code, end.line) == (code, line)
    assert all(proc.poll() is not None for proc in procs)  # nothing of the lane is left


@pytest.mark.parametrize("flag", ["--nproc", "--seconds", "--grace"])
def test_a_lane_asked_for_nothing_positive_is_bad_input_naming_the_field(flag, capsys):
    assert lane_main([flag, "0"]) == 2
    assert capsys.readouterr().err == f"error: {flag[2:]}: must be positive, got 0" + (
        ".0\n" if flag != "--nproc" else "\n")


def test_a_node_exits_with_its_agent_unless_the_driver_ended_the_world():
    assert node_exit(1, driver_ended=False) == 1
    assert node_exit(0, driver_ended=False) == 0
    assert node_exit(1, driver_ended=True) == 0


def test_the_drivers_end_mark_reaches_the_nodes_until_it_builds_again_and_silence_leaves_none():
    import torch.distributed as dist

    port = free_loopback_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10))
    try:
        stopped, ended = DriverBeat("127.0.0.1", port, period_s=0.1), None
        stopped.stop()  # gone silent (a crash): no mark
        node = DriverWatch("127.0.0.1", port)
        assert node.gone() is None and not node.ended
        ended = DriverBeat("127.0.0.1", port, period_s=0.1)
        ended.end()
        deadline = time.monotonic() + 10
        while not node.ended and time.monotonic() < deadline:
            node.gone()
            time.sleep(0.1)
        assert node.ended
        clear_end_mark("127.0.0.1", port)  # the driver builds a world again: no end now
        node.gone()
        assert not node.ended
    finally:
        for beat in (stopped, ended):
            if beat is not None:
                beat.stop()
        del store


def test_only_the_node_on_the_rendezvous_host_hosts_its_store():
    assert hosts_rendezvous(node_spec(2, 0, "127.0.0.1:5"))
    assert not hosts_rendezvous(node_spec(2, 1, "127.0.0.1:5"))  # loopback: node 0 hosts
    assert not hosts_rendezvous(node_spec(2, 0, "192.0.2.1:5"))  # TEST-NET: no address here


def test_a_node_whose_rendezvous_never_comes_up_gives_up_at_its_bound_in_one_line():
    endpoint = f"127.0.0.1:{free_loopback_port()}"  # nobody listens there
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{CONTROL_KEY_ENV: new_control_key().hex()})
    done = subprocess.run(
        [sys.executable, "-m", "harness.world.node", "--nnodes", "2", "--node-rank", "1",
         "--rdzv-endpoint", endpoint, "--nproc", "1", "--seconds", "1"],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    line = f"node 1: no rendezvous store at {endpoint} within 1 s (the node that hosts it " \
           "never started)"
    assert line in done.stderr.splitlines()
