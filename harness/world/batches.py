"""Batches through the persistent torchrun world: several scenarios per round trip, their
records streamed back while the caller judges the earlier ones.

Only fault-free scenarios of a config this launch of the world already captured cleanly go
in a batch. Their ranks run them back to back with no go-ahead between steps (a rank stops a
scenario after a step of its own that failed) and send each scenario's records in one
message. Whatever goes wrong in a batch (a rank's error, a missed deadline, a lost rank)
ends the world; that scenario then runs alone by the one-scenario protocol, which keeps its
exact records and evidence, and the scenarios sent after it go again.
"""

from __future__ import annotations

import selectors
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING

from harness.errors import ConfigError
from harness.history.records import StepRecord
from harness.history.scenario_history import ScenarioHistory
from harness.scenario import Scenario
from harness.world.wire import ChannelClosed

if TYPE_CHECKING:
    from harness.world.torchrun import TorchrunWorld

BATCH_SIZE = 8
# Batches unread by a busy rank wait in its socket buffer (128 KiB by default on Linux);
# were it to fill, the driver's send and the rank's next record would wait on each other.
MAX_BATCH = 16
IN_FLIGHT = 2  # batches sent ahead, so the ranks find the next one waiting
SLACK_S = 5.0  # past a scenario's step deadlines, for its message to arrive


def run_batched(world: TorchrunWorld, scenarios: Iterable[Scenario],
                batch_size: int = BATCH_SIZE) -> Iterator[ScenarioHistory]:
    if not 1 <= batch_size <= MAX_BATCH:
        raise ConfigError("batch_size", f"{batch_size} scenarios per round trip; give 1 to "
                          f"{MAX_BATCH}")
    pending = deque(scenarios)
    sent: deque[Scenario] = deque()  # in a batch, records not yet collected, in order
    try:
        while pending or sent:
            while (pending and len(sent) < IN_FLIGHT * batch_size
                   and _batchable(world, pending[0])):
                batch = []
                while pending and len(batch) < batch_size and _batchable(world, pending[0]):
                    batch.append(pending.popleft())
                world._send_to_all(("batch", [s.to_dict() for s in batch],
                                    asdict(world.timeouts)))
                sent.extend(batch)
            if not sent:  # the first of its config in this launch, or one with faults
                yield world.run(pending.popleft())
                continue
            scenario = sent.popleft()
            steps = _collect(world, scenario)
            if steps is None:
                world._end_world()
                pending.extendleft(reversed(sent))
                sent.clear()
                yield world.run(scenario)
            else:
                yield ScenarioHistory(scenario, world.timeouts,
                                      world.clean_capture(scenario.config), steps,
                                      batched=True)
    finally:
        if sent:  # the caller stopped early; the ranks still owe records nobody will read
            world._end_world()


def _batchable(world: TorchrunWorld, scenario: Scenario) -> bool:
    return (not scenario.faults and scenario.config.dp_size == world.nproc
            and world.clean_capture(scenario.config) is not None)


def _collect(world: TorchrunWorld, scenario: Scenario
             ) -> tuple[tuple[StepRecord, ...], ...] | None:
    """Every rank's records of `scenario`, step by step; None when any rank failed, went
    away, said anything else, or missed the deadline of the scenario's steps."""
    # The ranks run scenarios in order and the previous one's records are in: each rank has
    # started this one by now, so its deadline counts from here.
    deadline = (time.monotonic() + len(scenario.steps) * world.timeouts.step_deadline_s
                + SLACK_S)
    got: dict[int, list[StepRecord]] = {}
    selector = selectors.DefaultSelector()
    for rank, channel in world._channels.items():
        selector.register(channel, selectors.EVENT_READ, rank)
    try:
        while len(got) < world.nproc:
            ready = selector.select(timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            for key, _ in ready:
                try:
                    message = key.fileobj.recv(timeout_s=world.timeouts.collective_s)
                except (ChannelClosed, TimeoutError):
                    return None
                if message[0] != "ran":
                    return None  # a crash, a lost agent: the run alone names it
                got[key.data] = message[1]
                selector.unregister(key.fileobj)
    finally:
        selector.close()
    per_rank = [got[rank] for rank in range(world.nproc)]
    if any(len(records) != len(scenario.steps) or any(r.error is not None for r in records)
           for records in per_rank):
        return None
    return tuple(zip(*per_rank, strict=True))
