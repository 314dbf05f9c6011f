"""`python -m harness.bench.rank_step`: what one rank step costs, by how it ran.

The throughput bench's decode examples on 2 ranks as threads of this process (the sim
world's rank code, without its judge or scenario bookkeeping): per step, the CPU time of the
whole process (both ranks, their microbatch threads) and the wall time, split into replay,
eager microbatched and eager steps. CPU time is what a loaded machine disturbs least; the
minimum is the step with the least interference.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict

from harness.bench.examples import decode_examples
from harness.runtime.intra_op import one_intra_op_thread
from harness.sut.rank_runtime import RankRuntime
from harness.timeouts import Timeouts
from harness.world.sim.threads import ThreadWorld


def measure(examples: int) -> dict[str, list[tuple[float, float]]]:
    """(process CPU s, wall s) of every step of both ranks, keyed by what it executed."""
    scenarios = decode_examples(examples)
    nproc = scenarios[0].config.serving.dp_size
    timeouts = Timeouts()
    config = scenarios[0].config
    costs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    with ThreadWorld(nproc, timeout_s=timeouts.collective_s) as world:
        runtimes = world.run(lambda rank, group: RankRuntime(
            config, rank, group, collective_timeout_s=timeouts.collective_s,
            hang_timeout_s=timeouts.hang_s))
        world.run(lambda rank, _g: runtimes[rank].startup())

        for scenario in scenarios:
            for runtime in runtimes:
                runtime.reset_state()
            requests = scenario.requests()
            for i, ranks in enumerate(scenario.steps):
                cpu, wall = time.process_time(), time.perf_counter()
                records = world.run(
                    lambda rank, _g, i=i, ranks=ranks, now=requests[i]:
                    runtimes[rank].step(i, now[rank], ranks[rank]))
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                failed = [r for r in records if r.error is not None]
                if failed:
                    raise RuntimeError(f"rank {failed[0].rank} failed: {failed[0].error}")
                costs[records[0].executed].append((cpu, wall))
    return costs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.bench.rank_step")
    parser.add_argument("--examples", type=int, default=300)
    args = parser.parse_args(argv)
    one_intra_op_thread()
    costs = measure(args.examples)
    print(f"{'2-rank step':20} {'steps':>6} {'cpu ms (median)':>16} {'cpu ms (min)':>13} "
          f"{'wall ms (median)':>17}")
    for kind, values in sorted(costs.items()):
        cpu = [c for c, _ in values]
        print(f"{kind:20} {len(values):6} {1000 * statistics.median(cpu):16.2f} "
              f"{1000 * min(cpu):13.2f} {1000 * statistics.median(w for _, w in values):17.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
