"""CPU ranks forked from a zygote (harness/world/torchrun/rank_zygote.py): the ranks of every
launch of a world are its children, a connection without the key gets nothing, a rank dies
with its shim, and no forked rank outlives a spare that was never taken."""

from __future__ import annotations

import os
import socket
import time

import psutil
from process_watch import gone_within

from harness.check.judge import judge
from harness.scenario import scenario_from_dict
from harness.timeouts import Timeouts
from harness.world.torchrun.local_agent import LocalAgent
from harness.world.torchrun.rank_shim import NONCE_BYTES, send_frame
from harness.world.torchrun.world import TorchrunWorld
from harness.world.torchrun.zygote_client import RankZygote

TIMEOUTS = Timeouts(collective_s=2.0, hang_s=4.0, step_deadline_s=8.0)
CLEAN = scenario_from_dict({"config": {"capture_sizes": [8]}, "steps": [{"ranks": [4, 6]}]})


def forked_ranks(zygote_pid: int) -> list[int]:
    return [c.pid for c in psutil.Process(zygote_pid).children()]


def test_every_launch_of_a_cpu_world_forks_its_ranks_from_the_same_zygote():
    with TorchrunWorld(2, "gloo", TIMEOUTS, spares=0) as world:
        assert judge(world.run(CLEAN)).ok
        zygote = world.rig.zygote_pid
        first = set(world.rank_pids.values())
        assert zygote is not None and set(forked_ranks(zygote)) == first
        assert world.end_world() == []
        assert judge(world.run(CLEAN)).ok
        assert world.rig.zygote_pid == zygote  # torch imported once for both launches
        second = set(world.rank_pids.values())
        assert second.isdisjoint(first) and set(forked_ranks(zygote)) == second


def test_a_cuda_world_starts_each_rank_as_its_own_interpreter():
    # A CUDA driver set up before a fork is unusable after it; a zygote would set it up.
    assert not LocalAgent(2, "nccl", "cuda", None, spares=0).forks_ranks
    assert LocalAgent(2, "gloo", "cpu", None, spares=0).forks_ranks


def test_a_connection_without_the_key_is_dropped_and_gets_no_rank():
    zygote = RankZygote(preload_vllm=False)
    try:
        stranger = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        for _ in range(200):  # the zygote binds its socket once its imports are done
            try:
                stranger.connect(str(zygote.socket_path))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                time.sleep(0.05)
        stranger.settimeout(30)
        assert len(stranger.recv(NONCE_BYTES, socket.MSG_WAITALL)) == NONCE_BYTES
        stranger.sendall(b"\0" * 32)  # not the HMAC of the nonce
        try:  # then a well-formed request, which the zygote must never read
            send_frame(stranger, {"shim_pid": os.getpid(), "argv": ["--help"], "env": {},
                                  "cwd": "/"})
            socket.send_fds(stranger, [b"F"], [1, 2])
        except OSError:
            pass  # already closed on us
        try:  # closed without an answer (reset: it closed with our request unread)
            assert stranger.recv(1) == b""
        except ConnectionResetError:
            pass
        assert zygote.alive and forked_ranks(zygote.proc.pid) == []
    finally:
        assert zygote.close() == []


def test_a_rank_whose_shim_is_killed_is_killed_by_its_zygote():
    with TorchrunWorld(2, "gloo", TIMEOUTS, spares=0) as world:
        world.start()
        ranks = list(world.rank_pids.values())
        shims = psutil.Process(world.agent_pid).children()
        assert len(shims) == 2
        shims[0].kill()
        # torchrun stops the other shim, which passes the signal on; the killed shim's rank
        # has no one to tell it but the zygote.
        assert gone_within(ranks, 10) == []


def test_a_spare_never_taken_leaves_no_forked_rank_behind():
    world = TorchrunWorld(2, "gloo", TIMEOUTS, spares=1)
    world.start()
    world.end_world()
    world.start()  # the spare booted at the first end is taken, another boots
    zygote = world.rig.zygote_pid
    for _ in range(400):  # until the new spare's two ranks are forked too
        if len(forked_ranks(zygote)) == 4:
            break
        time.sleep(0.05)
    ranks = forked_ranks(zygote)
    assert len(ranks) == 4
    assert world.close() == []
    assert gone_within([*ranks, zygote], 10) == []
