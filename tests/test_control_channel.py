"""The control channel lets no stranger in: a connection to the driver's port that cannot
prove it holds the world's key is dropped before anything it sent is read, and the world's
launch and verdicts are exactly what they are without it."""

from __future__ import annotations

import os
import pickle
import socket
import struct
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

import pytest
from scenario_width import with_dp_size

from harness.check.judge import judge
from harness.scenario import load_scenario, scenario_from_dict
from harness.world.channel.control_server import ControlServer
from harness.world.channel.messages import WorkerReady, to_wire
from harness.world.channel.wire import new_control_key
from harness.world.torchrun.world import TorchrunWorld

pytestmark = pytest.mark.dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLEAN = {"name": "clean", "config": {"capture_sizes": [16, 32], "max_num_reqs": 32,
                                     "max_num_batched_tokens": 64, "decode_threshold": 8,
                                     "prefill_threshold": 16},
         "steps": [{"ranks": [20, 24]}, {"ranks": [32, 7]}]}


class _MakesADirectory:
    """A pickle that creates `path` when it is unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


@pytest.fixture
def world(request, nproc):
    world = TorchrunWorld(nproc, request.config.getoption("--backend"),
                          device=request.config.getoption("--device"))
    yield world
    assert world.close() == []


def scenarios(nproc: int):
    bug = load_scenario(os.path.join(ROOT, "scenarios", "guard-equality.json"))
    return [with_dp_size(scenario_from_dict(CLEAN), nproc), with_dp_size(bug, nproc)]


def verdicts(result):
    return ([(v.checker, v.ok, v.detail) for v in result.startup_verdicts],
            [[(v.checker, v.ok, v.detail) for v in s.verdicts] for s in result.steps])


def attack_while_launching(world: TorchrunWorld, act, count: int = 1) -> threading.Thread:
    """Run `act(port)` `count` times as soon as the driver listens (during the launch)."""

    def strangers() -> None:
        deadline = time.monotonic() + 60
        while world.listening_port is None and time.monotonic() < deadline:
            time.sleep(0.001)
        port = world.listening_port
        if port is not None:
            for _ in range(count):
                act(port)

    thread = threading.Thread(target=strangers, daemon=True)
    thread.start()
    return thread


def test_a_stranger_sending_a_pickle_changes_nothing_and_runs_nothing(world, tmp_path, capsys):
    marker = str(tmp_path / "the-pickle-ran")
    payload = pickle.dumps(("hello", 0, os.getpid(), _MakesADirectory(marker)))
    sent = []

    def send_pickle(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(struct.pack(">I", len(payload)) + payload)
            sent.append(port)
            try:
                sock.recv(1024)  # whatever the driver answers; then it hangs up
            except OSError:
                pass

    stranger = attack_while_launching(world, send_pickle)
    world.start()
    stranger.join(30)
    attacked = [verdicts(judge(world.run(s))) for s in scenarios(world.nproc)]
    assert sent and world.strangers_dropped >= 1
    assert not os.path.exists(marker), "the driver unpickled what a stranger sent"
    dropped = [line for line in capsys.readouterr().err.splitlines()
               if line.startswith("control channel: dropped a connection")]
    assert dropped and "failed the handshake" in dropped[0]
    world.close()
    world.start()  # no stranger this time
    assert attacked == [verdicts(judge(world.run(s))) for s in scenarios(world.nproc)]


def test_a_flood_of_silent_and_garbled_strangers_changes_neither_the_launch_nor_verdicts(world):
    held: list[socket.socket] = []

    def connect(port: int) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        if len(held) % 2:
            sock.sendall(b"\x00\x00\x00\x05junk!")
        held.append(sock)  # and never speak again

    stranger = attack_while_launching(world, connect, count=100)
    world.start()
    stranger.join(30)
    try:
        assert len(held) == 100
        assert all(judge(world.run(s)).ok == ok for s, ok in zip(scenarios(world.nproc),
                                                          (True, False), strict=True))
    finally:
        for sock in held:
            sock.close()


def test_a_key_holder_gets_through_while_silent_strangers_still_wait_out_their_bound():
    # Handshakes run side by side: one at a time, the key holder would come after fifty
    # silent strangers, each dropped only at its bound.
    key = new_control_key()
    server = ControlServer(key, log=lambda line: None)
    silent = [socket.create_connection(("127.0.0.1", server.port), timeout=5)
              for _ in range(50)]
    try:
        client = Client(("127.0.0.1", server.port), family="AF_INET", authkey=key)
        channel = server.accept(time.monotonic() + 60.0)
        # Not one stranger was dropped yet: the key holder did not wait for their bounds.
        assert server.dropped == 0
        client.send_bytes(to_wire(WorkerReady(1)))
        assert channel.recv(timeout_s=5) == WorkerReady(1)
        client.close()
        channel.close()
    finally:
        for sock in silent:
            sock.close()
        server.close()


def test_a_client_holding_a_wrong_key_is_refused_and_the_right_key_gets_through(capsys):
    key = new_control_key()
    server = ControlServer(key)
    try:
        with pytest.raises(AuthenticationError):
            Client(("127.0.0.1", server.port), family="AF_INET", authkey=b"wrong" * 8)
        with pytest.raises(TimeoutError):
            server.accept(time.monotonic() + 1.0)  # the refused client never reaches it
        assert server.dropped == 1
        assert "failed the handshake" in capsys.readouterr().err
        client = Client(("127.0.0.1", server.port), family="AF_INET", authkey=key)
        channel = server.accept(time.monotonic() + 10.0)
        client.send_bytes(to_wire(WorkerReady(3)))
        assert channel.recv(timeout_s=5) == WorkerReady(3)
        client.close()
        channel.close()
    finally:
        server.close()


def test_a_worker_with_a_wrong_key_cannot_join_a_world(world):
    refused = []

    def wrong_key(port: int) -> None:
        try:
            Client(("127.0.0.1", port), family="AF_INET", authkey=new_control_key())
        except AuthenticationError:
            refused.append(port)

    stranger = attack_while_launching(world, wrong_key)
    world.start()
    stranger.join(30)
    assert refused and world.strangers_dropped >= 1
    assert judge(world.run(scenarios(world.nproc)[0])).ok
