"""The messages of the worlds' two wire protocols, one frozen dataclass per kind, and their
wire form: JSON of {"kind": the class's name, "fields": its fields by their type hints}
(harness/history/codec.py), so nothing a peer sends is unpickled.

    torchrun: the driver <-> each rank's worker (harness/world/torchrun/)
    sandbox:  the driver <-> the zygote, and <-> each runner it forks (harness/world/sandbox/)

The first message of every connection is a hello (`WorkerHello`, `ZygoteReady`,
`RunnerHello`) carrying PROTOCOL_VERSION; a peer of another version is refused in one line
naming both. A hello's kind and its `version` field are read before anything else of it, so
they must never change; raise PROTOCOL_VERSION whenever any other kind or field does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from harness.errors import ConfigError
from harness.history.codec import decode, encode
from harness.history.records import StartupRecord, StepRecord
from harness.timeouts import Timeouts

# 2: float rows packed; 3: WorkerCannot, RunnerCannot (the harness failed); 4: StepOverdue
PROTOCOL_VERSION = 4


class ProtocolError(ConfigError):
    """A message that does not fit the protocol; `field` names where (kind.field)."""


class VersionMismatch(ProtocolError):
    """A peer that speaks another version of the protocol."""


class Message:
    """The base of every message kind."""


M = TypeVar("M", bound=Message)


# -- torchrun: the driver to a worker ------------------------------------------------------------


@dataclass(frozen=True)
class RunScenario(Message):
    scenario: Any  # the scenario's wire form (Scenario.to_dict)
    timeouts: Timeouts


@dataclass(frozen=True)
class StartSteps(Message):
    """After every rank's capture: whether the steps run."""

    go: bool


@dataclass(frozen=True)
class NextStep(Message):
    """After every rank's step: whether the next one runs."""

    go: bool


@dataclass(frozen=True)
class RunBatch(Message):
    scenarios: tuple[Any, ...]  # fault-free, of a config captured cleanly (wire forms)
    timeouts: Timeouts


@dataclass(frozen=True)
class Regroup(Message):
    generation: int
    timeout_s: float


@dataclass(frozen=True)
class Exit(Message):
    """Leave: to a worker, and to the sandbox's zygote."""


# -- torchrun: a worker to the driver ------------------------------------------------------------


@dataclass(frozen=True)
class WorkerNode:
    """Where a worker runs, as its hello tells the driver."""

    host: str
    agent_pid: int  # its torchrun agent
    group_rank: int  # its node's place in the world
    trace_dir: str


@dataclass(frozen=True)
class WorkerHello(Message):
    peer: ClassVar[str] = "a torchrun worker"
    rank: int
    pid: int
    node: WorkerNode
    version: int = PROTOCOL_VERSION


@dataclass(frozen=True)
class WorkerReady(Message):
    """The worker joined the process group."""

    rank: int


@dataclass(frozen=True)
class WorkerCannot(Message):
    """The worker's own code raised (reading the scenario, building its runtime, joining the
    group): the harness could not run it, no finding. The driver raises HarnessCannot."""

    rank: int
    what: str  # HarnessCannot's fields: what could not be done, in one line
    message: str
    traceback: str


@dataclass(frozen=True)
class AgentLost(Message):
    """Multi-node: the worker's torchrun agent died, said on the way out."""

    rank: int
    agent_pid: int


@dataclass(frozen=True)
class StartupReport(Message):
    record: StartupRecord


@dataclass(frozen=True)
class StepReport(Message):
    index: int
    record: StepRecord


@dataclass(frozen=True)
class StepOverdue(Message):
    """The rank's step `index` has run past its deadline and goes on: its waits have no
    bound (harness/world/torchrun/step_watch.py)."""

    rank: int
    index: int
    deadline_s: float


@dataclass(frozen=True)
class ScenarioDone(Message):
    """The rank finished the scenario."""


@dataclass(frozen=True)
class BatchRan(Message):
    """Every record of one scenario of a batch."""

    records: tuple[StepRecord, ...]


@dataclass(frozen=True)
class Regrouped(Message):
    rank: int


@dataclass(frozen=True)
class RegroupFailed(Message):
    rank: int
    traceback: str


# -- sandbox: the driver and its zygote ----------------------------------------------------------


@dataclass(frozen=True)
class ForkRunner(Message):
    """Fork a runner; its channel's fd follows on the socket (SCM_RIGHTS)."""

    nproc: int
    timeouts: Timeouts
    trace_dir: str


@dataclass(frozen=True)
class LoadSystem(Message):
    config: Any  # the config's wire form (HarnessConfig.to_dict)


@dataclass(frozen=True)
class ReapRunner(Message):
    pid: int
    timeout_s: float


@dataclass(frozen=True)
class ZygoteReady(Message):
    peer: ClassVar[str] = "the sandbox's zygote"
    pid: int
    version: int = PROTOCOL_VERSION


@dataclass(frozen=True)
class RunnerForked(Message):
    pid: int


@dataclass(frozen=True)
class SystemLoaded(Message):
    failure: str | None  # the traceback of a load that raised


@dataclass(frozen=True)
class RunnerReaped(Message):
    pid: int
    exit_code: int | None  # negative: the signal that ended it; None: not the zygote's child


# -- sandbox: the driver and a runner ------------------------------------------------------------


@dataclass(frozen=True)
class SimRun(Message):
    scenario: Any  # the scenario's wire form (Scenario.to_dict)


@dataclass(frozen=True)
class RunnerHello(Message):
    peer: ClassVar[str] = "a sandbox runner"
    pid: int
    version: int = PROTOCOL_VERSION


@dataclass(frozen=True)
class SimStartup(Message):
    records: tuple[StartupRecord | None, ...]  # every rank's


@dataclass(frozen=True)
class SimStep(Message):
    index: int
    records: tuple[StepRecord | None, ...]  # every rank's


@dataclass(frozen=True)
class SimDone(Message):
    retired: bool  # a failure left groups no one may tear down: the runner exits


@dataclass(frozen=True)
class RunnerCannot(Message):
    """The harness's own code raised in the runner (reading the scenario, building a rank's
    runtime): no finding of the system under test. The driver raises HarnessCannot."""

    what: str  # HarnessCannot's fields: what could not be done, in one line
    message: str
    traceback: str


TORCHRUN = (RunScenario, StartSteps, NextStep, RunBatch, Regroup, Exit, WorkerHello,
            WorkerReady, WorkerCannot, AgentLost, StartupReport, StepReport, ScenarioDone,
            BatchRan, Regrouped, RegroupFailed, StepOverdue)
SANDBOX = (ForkRunner, LoadSystem, ReapRunner, Exit, ZygoteReady, RunnerForked, SystemLoaded,
           RunnerReaped, SimRun, RunnerHello, SimStartup, SimStep, SimDone, RunnerCannot)
KINDS: dict[str, type[Message]] = {cls.__name__: cls for cls in (*TORCHRUN, *SANDBOX)}
HELLOS = (WorkerHello, ZygoteReady, RunnerHello)


# -- the wire form -------------------------------------------------------------------------------


def to_wire(message: Message) -> bytes:
    kind = type(message).__name__
    if KINDS.get(kind) is not type(message):
        raise TypeError(f"{message!r} is no message of the wire protocols")
    # Float rows packed (harness/history/packed_rows.py): most of a step record's bytes.
    return json.dumps({"kind": kind, "fields": encode(message, type(message), pack=True)},
                      separators=(",", ":")).encode()


def from_wire(data: bytes) -> Message:
    """The message `to_wire` gave `data`; ProtocolError (one line) when it does not fit."""
    try:
        envelope = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError("message", f"is not JSON ({exc})") from None
    if not isinstance(envelope, dict) or set(envelope) != {"kind", "fields"}:
        raise ProtocolError("message", "must be an object of its kind and fields")
    kind, fields = envelope["kind"], envelope["fields"]
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError("message.kind", f"{kind!r} is no message of protocol version "
                            f"{PROTOCOL_VERSION}")
    if cls in HELLOS:
        check_version(cls, fields)
    try:
        return decode(fields, cls, kind)
    except ConfigError as exc:
        raise ProtocolError(exc.field, exc.message) from None


def check_version(cls: type, fields: Any) -> None:
    """Before the rest of a hello is read: a peer of another version may differ in it."""
    theirs = fields.get("version") if isinstance(fields, dict) else None
    if theirs != PROTOCOL_VERSION or isinstance(theirs, bool):
        said = "names no version" if theirs is None else f"speaks version {theirs!r}"
        raise VersionMismatch("protocol version", f"{cls.peer} {said}, this harness speaks "
                              f"version {PROTOCOL_VERSION}: run one harness version on every "
                              "side")
