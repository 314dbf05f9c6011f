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

import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Protocol

from harness.errors import ConfigError
from harness.history.records import StartupRecord, StepRecord
from harness.history.scenario_history import ScenarioHistory
from harness.scenario import Scenario
from harness.timeouts import Timeouts
from harness.world.channel.links import RankLinks
from harness.world.channel.messages import BatchRan, RunBatch


class BatchedWorld(Protocol):
    """What a batch needs of its world (harness/world/torchrun/world.py is one)."""

    nproc: int
    timeouts: Timeouts
    links: RankLinks

    def run(self, scenario: Scenario) -> ScenarioHistory: ...

    def end_world(self) -> list[int]: ...

    def clean_capture(self, config) -> tuple[StartupRecord, ...] | None: ...


BATCH_SIZE = 8
# Batches unread by a busy rank wait in its socket buffer (128 KiB by default on Linux);
# were it to fill, the driver's send and the rank's next record would wait on each other.
MAX_BATCH = 16
IN_FLIGHT = 2  # batches sent ahead, so the ranks find the next one waiting


def run_batched(world: BatchedWorld, scenarios: Iterable[Scenario],
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
                world.links.send_to_all(RunBatch(tuple(s.to_dict() for s in batch),
                                                 world.timeouts))
                sent.extend(batch)
            if not sent:  # the first of its config in this launch, or one with faults
                yield world.run(pending.popleft())
                continue
            scenario = sent.popleft()
            steps = _collect(world, scenario)
            if steps is None:
                world.end_world()
                pending.extendleft(reversed(sent))
                sent.clear()
                yield world.run(scenario)
            else:
                yield ScenarioHistory(scenario, world.timeouts,
                                      world.clean_capture(scenario.config), steps,
                                      batched=True)
    finally:
        if sent:  # the caller stopped early; the ranks still owe records nobody will read
            world.end_world()


def _batchable(world: BatchedWorld, scenario: Scenario) -> bool:
    return (not scenario.faults and scenario.config.serving.dp_size == world.nproc
            and world.clean_capture(scenario.config) is not None)


def _collect(world: BatchedWorld, scenario: Scenario
             ) -> tuple[tuple[StepRecord, ...], ...] | None:
    """Every rank's records of `scenario`, step by step; None when any rank failed, went
    away, said anything else, or missed the deadline of the scenario's steps."""
    # The ranks run scenarios in order and the previous one's records are in: each rank has
    # started this one by now, so its deadline counts from here.
    deadline = time.monotonic() + world.timeouts.batch_wait_s(len(scenario.steps))
    got: dict[int, list[StepRecord]] = {}
    with world.links.inbox() as inbox:
        while len(got) < world.nproc:
            ready = inbox.poll(max(0.0, deadline - time.monotonic()),
                               world.timeouts.collective_s)
            if not ready:
                return None
            for rank, message in ready:
                if not isinstance(message, BatchRan):
                    return None  # gone, a crash, a lost agent: the run alone names it
                got[rank] = list(message.records)
                inbox.drop(rank)
    per_rank = [got[rank] for rank in range(world.nproc)]
    if any(len(records) != len(scenario.steps) or any(r.error is not None for r in records)
           for records in per_rank):
        return None
    return tuple(zip(*per_rank, strict=True))
