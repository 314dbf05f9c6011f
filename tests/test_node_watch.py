"""No process of a multi-node world outlives its driver: each node's launcher stops its
torchrun agent at once when a driver on its host exits (SIGTERM or SIGKILL), and, for a node
elsewhere, when the driver's beat in the rendezvous store stands still past the bound."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
from process_watch import alive, gone_within

from harness.world.channel.wire import CONTROL_KEY_ENV, new_control_key
from harness.world.multinode.heartbeat import DriverBeat, driver_silent
from harness.world.multinode.loopback import free_loopback_port

ROOT = Path(__file__).resolve().parents[1]
# The launcher's reaction (0.5 s), its agent's shutdown, the launcher's grace (10 s) and
# the load of a 2-core machine running two test processes.
GONE_WITHIN_S = 45.0

DRIVER = textwrap.dedent("""
    import time
    from harness.scenario import scenario_from_dict
    from harness.timeouts import Timeouts
    from harness.world.multinode.loopback import loopback_multi_node_world

    world = loopback_multi_node_world(2, 2, Timeouts(collective_s=3.0, hang_s=5.0,
                                                     step_deadline_s=10.0))
    config = {"capture_sizes": [16, 32], "max_num_reqs": 32, "max_num_batched_tokens": 64,
              "decode_threshold": 8, "prefill_threshold": 16}
    world.run(scenario_from_dict({"name": "clean", "config": config,
                                  "steps": [{"ranks": [20, 24, 20, 24]}]}))
    print("ran", flush=True)
    time.sleep(600)  # until the test signals this driver
""")




def _kill(pids) -> None:
    for pid in alive(pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _named(procs, module: str) -> list[int]:
    found = []
    for proc in procs:
        try:
            if module in proc.cmdline():
                found.append(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return found


def test_the_driver_counts_as_gone_only_past_the_bound_that_applies():
    assert not driver_silent(now=29.0, since=0.0, beat_seen=True, silence_s=30.0,
                             first_beat_s=600.0)
    assert driver_silent(31.0, 0.0, True, 30.0, 600.0)
    # Before a first beat (a node started before its driver) the longer bound holds.
    assert not driver_silent(31.0, 0.0, False, 30.0, 600.0)
    assert driver_silent(601.0, 0.0, False, 30.0, 600.0)


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_a_node_elsewhere_stops_its_agent_when_the_drivers_beat_stands_still(tmp_path):
    import torch.distributed as dist

    port = free_loopback_port()
    # The rendezvous store (the driver's node hosts it); this test beats as the driver.
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10))
    beat = DriverBeat("127.0.0.1", port, period_s=0.2)
    log = tmp_path / "node.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{CONTROL_KEY_ENV: new_control_key().hex()})
    # No --driver-pid: a node on another host knows its driver by the beat alone.
    node = subprocess.Popen(
        [sys.executable, "-m", "harness.world.node", "--nnodes", "2", "--node-rank", "1",
         "--rdzv-endpoint", f"127.0.0.1:{port}", "--nproc", "1", "--driver-silence", "4"],
        env=env, stdin=subprocess.DEVNULL, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True)
    tree: list[int] = [node.pid]
    try:
        deadline = time.monotonic() + 60
        while not (agents := psutil.Process(node.pid).children()):
            assert node.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        tree += [p.pid for p in agents]
        time.sleep(8.0)  # twice the bound, beating: the node keeps its agent
        assert node.poll() is None, log.read_text()
        assert alive(tree) == tree
        beat.stop()
        stopped = time.monotonic()
        assert gone_within(tree, GONE_WITHIN_S) == [], log.read_text()
        assert time.monotonic() - stopped >= 4.0  # not before the bound
        assert "no beat of its driver in the rendezvous store for 4 s" in log.read_text()
    finally:
        beat.stop()
        _kill(tree)
        del store


@pytest.mark.dist
@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_no_launcher_agent_or_worker_outlives_a_driver_that_was_signalled(request, sig,
                                                                          tmp_path):
    if request.config.getoption("--nnodes") < 2:
        pytest.skip("two torchrun agents on loopback: run under make test-dp NNODES=2")
    # A killed driver cannot remove its folders: they go in pytest's, not in /tmp.
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], env=env, cwd=ROOT,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    tree: list[int] = []
    try:
        ready, _, _ = select.select([driver.stdout], [], [], 150)
        assert ready and driver.stdout.readline() == b"ran\n", "the driver's world never ran"
        procs = psutil.Process(driver.pid).children(recursive=True)
        tree = [p.pid for p in procs]
        # Both nodes' launchers, both torchrun agents, all four ranks (torchrun may keep
        # helpers of its own whose command lines name the worker too).
        assert len(_named(procs, "harness.world.node")) == 2
        assert len(_named(procs, "torch.distributed.run")) == 2
        assert len(_named(procs, "harness.world.torchrun.worker")) >= 4
        driver.send_signal(sig)
        driver.wait(timeout=30)
        assert gone_within(tree, GONE_WITHIN_S) == []
    finally:
        _kill([driver.pid, *tree])
        driver.wait(timeout=10)
