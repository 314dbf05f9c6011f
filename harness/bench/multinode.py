"""`make bench`'s DP 4 rows: one torchrun agent of 4 ranks against two agents of 2 ranks on a
loopback c10d rendezvous (the multi-node path on one machine).

Per layout: the world's start-up (torchrun, rendezvous, `import torch`, every worker
connected and in the group), examples per second through it (decode-sized one-step
examples, records back, reference and checkers), and the control channel's cost: per
example, the driver's wall time beyond the slowest rank's own step (sending the scenario,
collecting the records, the go/next messages).
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

from harness.bench.examples import CONFIG  # the same decode examples' config
from harness.check.judge import judge
from harness.scenario import Scenario, scenario_from_dict
from harness.timeouts import Timeouts
from harness.world.multinode.loopback import loopback_multi_node_world
from harness.world.torchrun.world import TorchrunWorld


@dataclass(frozen=True)
class LayoutRow:
    layout: str
    startup_s: float
    examples: int
    seconds: float
    channel_ms: float  # median driver time beyond the slowest rank's step
    step_ms: float  # median slowest rank's step

    @property
    def per_second(self) -> float:
        return self.examples / self.seconds if self.seconds else 0.0


def dp4_examples(count: int, seed: int = 0) -> list[Scenario]:
    rng = random.Random(seed)
    return [scenario_from_dict({"name": f"bench-dp4-{i}", "config": CONFIG, "steps": [
        {"ranks": [rng.randint(1, 64) for _ in range(4)]}]}) for i in range(count)]


def measure(layout: str, world, examples: list[Scenario]) -> LayoutRow:
    with world:
        began = time.perf_counter()
        world.start()
        startup = time.perf_counter() - began
        world.run(examples[0])  # capture happens once per config
        beyond, steps = [], []
        start = time.perf_counter()
        for example in examples:
            t0 = time.perf_counter()
            history = world.run(example)
            t1 = time.perf_counter()
            result = judge(history)
            assert result.ok, result.failed_verdicts()
            slowest = max(r.seconds for r in result.steps[0].records)
            steps.append(slowest)
            beyond.append((t1 - t0) - slowest)  # run() alone: the checkers are not in it
        elapsed = time.perf_counter() - start
    return LayoutRow(layout, startup, len(examples), elapsed,
                     1000 * statistics.median(beyond), 1000 * statistics.median(steps))


def dp4_rows(count: int) -> list[LayoutRow]:
    examples = dp4_examples(count)
    timeouts = Timeouts()
    return [measure("1 node x 4 ranks", TorchrunWorld(4, timeouts=timeouts), examples),
            measure("2 nodes x 2 ranks (loopback)", loopback_multi_node_world(2, 2, timeouts),
                    examples)]


def print_dp4(rows: list[LayoutRow]) -> None:
    print(f"\nDP 4: {'layout':30} {'start s':>8} {'examples':>8} {'examples/s':>10} "
          f"{'channel ms':>10} {'step ms':>8}")
    for r in rows:
        print(f"      {r.layout:30} {r.startup_s:8.1f} {r.examples:>8} {r.per_second:10.1f} "
              f"{r.channel_ms:10.2f} {r.step_ms:8.2f}")


if __name__ == "__main__":
    import sys

    print_dp4(dp4_rows(int(sys.argv[1]) if len(sys.argv) > 1 else 200))
