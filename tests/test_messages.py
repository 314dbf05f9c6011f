"""The typed messages of the worlds' wire protocols: every kind comes back from its JSON wire
form as it was sent, a message that does not fit is refused in one line naming the field, and
a peer of another protocol version is refused at its hello in one line naming both versions,
through the handshake and through a whole `run` whose worker is of another version."""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

import pytest
import record_builders as rb

from harness.cli import EXIT_BAD_INPUT, main
from harness.config import HarnessConfig
from harness.scenario import scenario_from_dict
from harness.timeouts import Timeouts
from harness.world.channel import messages as m
from harness.world.channel.control_server import ControlServer
from harness.world.channel.wire import (
    CONTROL_KEY_ENV,
    Channel,
    ChannelClosed,
    expect_hello,
    new_control_key,
)
from harness.world.torchrun import local_agent
from harness.world.torchrun.agent_launch import AgentLaunch

SCENARIO = {"name": "clean", "config": {"capture_sizes": [16, 32], "max_num_reqs": 32,
                                        "max_num_batched_tokens": 64, "decode_threshold": 8,
                                        "prefill_threshold": 16},
            "steps": [{"ranks": [20, 24]}, {"ranks": [32, 7]}]}
NODE = m.WorkerNode("host-a", 41, 0, "/tmp/traces")


def examples() -> list[m.Message]:
    """One message of every kind, each field set (payloads already in their JSON form)."""
    step, startup = rb.step_records(2)[0], rb.startup_records(2)[0]
    scenario = json.loads(json.dumps(scenario_from_dict(SCENARIO).to_dict()))
    timeouts = Timeouts(collective_s=2.0, hang_s=4.0, step_deadline_s=15.0)
    return [
        m.RunScenario(scenario, timeouts), m.StartSteps(True), m.NextStep(False),
        m.RunBatch((scenario, scenario), timeouts), m.Regroup(3, 2.5), m.Exit(),
        m.WorkerHello(1, 4321, NODE), m.WorkerReady(1),
        m.WorkerCannot(1, "world", "rank 1 raised", "Traceback ..."),
        m.AgentLost(1, 77), m.StartupReport(startup), m.StepReport(0, step),
        m.StepOverdue(1, 2, 3.0), m.ScenarioDone(), m.BatchRan((step, step)), m.Regrouped(1),
        m.RegroupFailed(1, "tb"),
        m.ForkRunner(2, timeouts, "/tmp/sim"), m.LoadSystem({"sut": "vllm"}),
        m.ReapRunner(99, 2.0), m.ZygoteReady(12), m.RunnerForked(13), m.SystemLoaded(None),
        m.SystemLoaded("Traceback ..."), m.RunnerReaped(13, -6), m.RunnerReaped(14, None),
        m.SimRun(scenario), m.RunnerHello(13), m.SimStartup((startup, None)),
        m.SimStep(1, (step, None)), m.SimDone(True),
        m.RunnerCannot("world", "rank 0 could not build its runtime", "Traceback ..."),
    ]


def wire_dict(message: m.Message) -> dict:
    return json.loads(m.to_wire(message))


def raw(kind: str, fields) -> bytes:
    return json.dumps({"kind": kind, "fields": fields}).encode()


def channel_pair() -> tuple[Channel, Channel]:
    a, b = socket.socketpair()
    pair = Channel(Connection(os.dup(a.fileno()))), Channel(Connection(os.dup(b.fileno())))
    a.close()
    b.close()
    return pair


def test_every_message_kind_comes_back_from_the_wire_as_it_was_sent():
    sent = examples()
    assert {type(x) for x in sent} == set(m.KINDS.values())  # a new kind needs an example
    for message in sent:
        assert m.from_wire(m.to_wire(message)) == message, type(message).__name__


def test_every_kind_belongs_to_a_protocol_and_the_tags_are_the_class_names():
    assert set(m.TORCHRUN) | set(m.SANDBOX) == set(m.KINDS.values())
    assert all(m.KINDS[name].__name__ == name for name in m.KINDS)
    assert wire_dict(m.Regroup(3, 2.5)) == {"kind": "Regroup",
                                            "fields": {"generation": 3, "timeout_s": 2.5}}


def test_the_scenario_and_config_a_message_carries_read_back_equal():
    scenario = scenario_from_dict(SCENARIO)
    back = m.from_wire(m.to_wire(m.RunScenario(scenario.to_dict(), Timeouts())))
    assert scenario_from_dict(back.scenario) == scenario
    config = HarnessConfig.of(dp_size=2)
    assert HarnessConfig.from_dict(m.from_wire(m.to_wire(m.LoadSystem(config.to_dict())))
                                   .config) == config


def test_a_record_crosses_the_wire_exactly_non_finite_floats_included():
    step = rb.step_records(2)[0]
    odd = type(step)(**{**step.__dict__, "outputs": ((float("nan"), -0.0), (1e-300, 2.0)),
                        "state": ((float("inf"), float("-inf")),)})
    back = m.from_wire(m.to_wire(m.StepReport(0, odd))).record
    assert repr(back.outputs) == repr(odd.outputs) and back.state == odd.state
    assert back.routes == odd.routes and isinstance(back.routes[0], tuple)


@pytest.mark.parametrize("kind, fields, field, says", [
    ("WorkerReady", {}, "WorkerReady.rank", "is missing"),
    ("WorkerReady", {"rank": 1, "pid": 2}, "WorkerReady.pid", "is not a field"),
    ("WorkerReady", {"rank": "one"}, "WorkerReady.rank", "must be an integer"),
    ("StartSteps", {"go": 1}, "StartSteps.go", "must be true or false"),
    ("StepReport", {"index": 0, "record": {"rank": 0}}, "StepReport.record.",
     "is missing"),
    ("SimStep", {"index": 0, "records": "none"}, "SimStep.records", "must be a list"),
    ("Shutdown", {}, "message.kind",
     f"'Shutdown' is no message of protocol version {m.PROTOCOL_VERSION}"),
    ("WorkerReady", [1], "WorkerReady", "must be an object"),
])
def test_a_message_that_does_not_fit_is_refused_in_one_line_naming_the_field(
        kind, fields, field, says):
    with pytest.raises(m.ProtocolError) as refused:
        m.from_wire(raw(kind, fields))
    assert refused.value.field.startswith(field) and says in refused.value.message
    assert "\n" not in str(refused.value)


def test_bytes_that_are_no_envelope_are_refused_and_a_pickle_is_never_loaded(tmp_path):
    marker = tmp_path / "unpickled"

    class MakesAFile:
        def __reduce__(self):
            return (Path.touch, (marker,))

    for data, says in [(b"\x80\x04not json", "is not JSON"), (b"[1, 2]", "must be an object"),
                       (json.dumps({"kind": "Exit"}).encode(), "must be an object"),
                       (pickle.dumps(MakesAFile()), "is not JSON")]:
        with pytest.raises(m.ProtocolError) as refused:
            m.from_wire(data)
        assert refused.value.field == "message" and says in refused.value.message
    assert not marker.exists()


def test_a_message_that_does_not_fit_is_a_protocol_error_from_the_channel_not_a_closed_one():
    driver, worker = channel_pair()
    worker.connection.send_bytes(raw("WorkerReady", {"rank": "one"}))
    with pytest.raises(m.ProtocolError) as refused:
        driver.recv(timeout_s=5)
    assert not isinstance(refused.value, ChannelClosed)
    worker.send(m.WorkerReady(2))  # the channel itself is still whole
    assert driver.recv(timeout_s=5) == m.WorkerReady(2)
    driver.close()
    worker.close()


@pytest.mark.parametrize("hello", [m.WorkerHello(0, 1, NODE), m.ZygoteReady(1),
                                   m.RunnerHello(1)], ids=lambda h: type(h).__name__)
def test_a_hello_of_another_version_is_refused_in_one_line_naming_both_versions(hello):
    driver, peer = channel_pair()
    # A later version may change the hello's other fields: the version is read first.
    later = m.PROTOCOL_VERSION + 1
    fields = {**wire_dict(hello)["fields"], "version": later, "features": ["new"]}
    peer.connection.send_bytes(raw(type(hello).__name__, fields))
    with pytest.raises(m.VersionMismatch) as refused:
        expect_hello(driver, type(hello), timeout_s=5)
    line = str(refused.value)
    assert "\n" not in line and hello.peer in line
    assert f"speaks version {later}" in line and f"speaks version {m.PROTOCOL_VERSION}" in line
    with pytest.raises(ChannelClosed):  # refused: the driver hangs up on it
        peer.recv(timeout_s=5)
    peer.close()


def test_a_hello_that_names_no_version_is_refused_and_one_of_this_version_is_taken():
    driver, peer = channel_pair()
    fields = wire_dict(m.RunnerHello(5))["fields"]
    del fields["version"]
    peer.connection.send_bytes(raw("RunnerHello", fields))
    with pytest.raises(m.VersionMismatch, match="names no version"):
        expect_hello(driver, m.RunnerHello, timeout_s=5)
    driver, peer = channel_pair()
    peer.send(m.RunnerHello(5))
    assert expect_hello(driver, m.RunnerHello, timeout_s=5) == m.RunnerHello(5)


def test_a_first_message_that_is_no_hello_is_refused():
    driver, peer = channel_pair()
    peer.send(m.WorkerReady(0))
    with pytest.raises(m.ProtocolError, match="the first must be WorkerHello, not WorkerReady"):
        expect_hello(driver, m.WorkerHello, timeout_s=5)


# A worker of another harness version, as far as its hello: it then waits to be killed.
OLD_WORKER = """
import json, os, sys, time
from multiprocessing.connection import Client
c = Client(("127.0.0.1", int(sys.argv[1])), family="AF_INET",
           authkey=bytes.fromhex(os.environ.pop("KEY_ENV")))
c.send_bytes(json.dumps({"kind": "WorkerHello", "fields": {"rank": 0, "pid": os.getpid(),
    "node": {"host": "h", "agent_pid": 1, "group_rank": 0, "trace_dir": "/t"},
    "version": 99}}).encode())
time.sleep(120)
"""


def test_a_run_whose_worker_is_of_another_version_ends_in_one_line_and_kills_it(
        monkeypatch, tmp_path, capsys):
    started: list[subprocess.Popen] = []

    def old_worker_launch(nproc: int, worker_args: list[str], zygote_env=None) -> AgentLaunch:
        key = new_control_key()
        server = ControlServer(key)
        proc = subprocess.Popen([sys.executable, "-c", OLD_WORKER.replace("KEY_ENV",
                                                                          CONTROL_KEY_ENV),
                                 str(server.port)], env={**os.environ, CONTROL_KEY_ENV: key.hex()},
                                start_new_session=True)
        started.append(proc)
        (tmp_path / "trace").mkdir()
        return AgentLaunch(proc, server, tmp_path / "trace")

    monkeypatch.setattr(local_agent, "launch_agent", old_worker_launch)
    path = tmp_path / "clean.json"
    path.write_text(json.dumps(SCENARIO))
    start = time.monotonic()
    code = main(["run", "--world", "torchrun", "--scenario", str(path)])
    assert code == EXIT_BAD_INPUT and time.monotonic() - start < 30
    err = capsys.readouterr().err.strip()
    assert err == (f"error: protocol version: a torchrun worker speaks version 99, this "
                   f"harness speaks version {m.PROTOCOL_VERSION}: run one harness version on "
                   "every side")
    assert len(started) == 1 and started[0].poll() is not None  # the driver ended it
