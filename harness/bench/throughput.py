"""`make bench`: examples per second through the 2-rank torchrun world, three ways, one table;
then the fuzzer's time to detection of every planted bug, per world.

- persistent: one world fed every example (sync, pad, replay or eager microbatched step with
  real all-to-alls, records back to the driver, reference and checkers);
- spawn per example: a fresh torchrun job for each example, as spawn-per-test harnesses do;
- collective floor: a torchrun job looping only the collectives one such step issues.

Then the sim world on the same examples, side by side: its ranks as threads of this process,
and in its sandbox process (the default world, which survives a rank that aborts).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from harness.bench.cpu import ceiling_per_second, cores, cpu_seconds
from harness.bench.detection import (
    COLUMNS,
    detection_rows,
    print_detection,
    random_seeds,
    timed_variants,
)
from harness.bench.examples import decode_examples
from harness.bench.multinode import dp4_rows, print_dp4
from harness.bench.reach import print_reach_table
from harness.bench.rebuilds import print_rebuilds, rebuild_rows, sandbox_rows
from harness.bench.schedules import add_arguments as add_schedule_arguments
from harness.bench.schedules import run_from_args as print_schedule_costs
from harness.bench.staging import DRAWS, print_staging_table
from harness.check.judge import judge
from harness.check.stream import judge_stream
from harness.scenario import Scenario
from harness.timeouts import Timeouts
from harness.world.processes.lifecycle import package_pythonpath
from harness.world.sandbox.world import SandboxedSimWorld
from harness.world.sim.world import SimWorld
from harness.world.torchrun.batches import BATCH_SIZE, MAX_BATCH
from harness.world.torchrun.world import TorchrunWorld


@dataclass(frozen=True)
class Row:
    mode: str
    examples: int
    seconds: float
    note: str = ""
    # Shares of the wall time: the slowest rank's steps, the driver's CPU (reference,
    # checks, decoding, sending), and the rest (the wire: messages in flight, ranks idle).
    shares: tuple[float, float, float] | None = None
    # CPU time of every process of the row (ranks, driver, sandbox), ms per example.
    cpu_ms: float | None = None

    @property
    def per_second(self) -> float:
        return self.examples / self.seconds if self.seconds else 0.0

    @property
    def ms_per_example(self) -> float:
        return 1000 * self.seconds / self.examples if self.examples else 0.0


def persistent(examples: list[Scenario], batch_size: int = 0, backend: str = "gloo"
               ) -> tuple[Row, dict[str, float]]:
    """One world fed every example: one per round trip (`batch_size` 0), or `batch_size`
    per round trip, judged while the ranks run the next ones."""
    with TorchrunWorld(2, backend, timeouts=Timeouts()) as world:
        world.start()
        world.run(examples[0])  # capture happens once per config
        kinds: dict[str, int] = {}
        worker_s = []
        pids = world.rank_pids.values()
        ranks_cpu = cpu_seconds(pids)
        start, cpu = time.perf_counter(), time.process_time()
        if batch_size:
            results = judge_stream(world.run_many(examples, batch_size), world.run)
        else:
            results = (judge(world.run(example)) for example in examples)
        for result in results:
            assert result.ok, result.failed_verdicts()
            records = result.steps[0].records
            worker_s.append(max(r.seconds for r in records))
            kind = records[0].executed
            kinds[kind] = kinds.get(kind, 0) + 1
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        ranks_cpu = cpu_seconds(pids) - ranks_cpu
    mix = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
    mode = (f"persistent {backend} world, batches of {batch_size}, pipelined" if batch_size
            else f"persistent {backend} world, one example per round trip")
    cpu_ms = 1000 * (ranks_cpu + cpu) / len(examples)
    return (Row(mode, len(examples), elapsed, mix, _shares(elapsed, sum(worker_s), cpu), cpu_ms),
            {f"rank step (ms, median), {mode}": 1000 * statistics.median(worker_s)})


def _shares(elapsed: float, ranks_s: float, driver_s: float) -> tuple[float, float, float]:
    ranks, driver = ranks_s / elapsed, driver_s / elapsed
    return ranks, driver, max(0.0, 1.0 - ranks - driver)


def spawn_per_example(examples: list[Scenario], backend: str = "gloo") -> Row:
    start = time.perf_counter()
    for example in examples:
        with TorchrunWorld(2, backend, timeouts=Timeouts()) as world:
            assert judge(world.run(example)).ok
    return Row("fresh torchrun job per example", len(examples), time.perf_counter() - start)


def collective_floor(iterations: int, backend: str = "gloo") -> Row:
    """The same collectives as a microbatched step, alone, in a 2-rank torchrun job."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "harness.bench.floor", str(iterations), backend]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                         env={**_env(), "PYTHONPATH": package_pythonpath()})
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines:
        raise RuntimeError(f"floor job failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    result = json.loads(lines[-1])
    return Row(f"collective floor (sync + 4 all-to-alls, {backend})", iterations,
               result["seconds"],
               cpu_ms=1000 * result["cpu"] / iterations)


def sim_rows(examples: list[Scenario], rounds: int = 4) -> list[Row]:
    """The sim world in this process and sandboxed, fed alternating slices of the examples
    so that a machine's load falls on both alike."""
    worlds = {"sim world, ranks in this process": SimWorld(2, Timeouts()),
              "sim world, sandboxed (the default)": SandboxedSimWorld(2, Timeouts())}
    seconds, cpu = dict.fromkeys(worlds, 0.0), dict.fromkeys(worlds, 0.0)
    try:
        for world in worlds.values():
            world.run(examples[0])  # capture happens once per config
        size = -(-len(examples) // rounds)
        for i in range(0, len(examples), size):
            for mode, world in worlds.items():
                pids = [pid for pid in [getattr(world, "runner_pid", None)] if pid is not None]
                start, cpu_start = time.perf_counter(), time.process_time() + cpu_seconds(pids)
                for example in examples[i:i + size]:
                    assert judge(world.run(example)).ok
                seconds[mode] += time.perf_counter() - start
                cpu[mode] += time.process_time() + cpu_seconds(pids) - cpu_start
    finally:
        for world in worlds.values():
            world.close()
    return [Row(mode, len(examples), s, cpu_ms=1000 * cpu[mode] / len(examples))
            for mode, s in seconds.items()]


def print_rows(rows: list[Row], floor: Row | None) -> None:
    print(f"{'mode':48} {'examples':>8} {'seconds':>8} {'examples/s':>10} {'ms/example':>10} "
          f"{'x floor':>8} {'ranks/driver/wire %':>19} {'cpu ms':>7} {'cpu cap/s':>9}  mix")
    for row in rows:
        times = f"{row.ms_per_example / floor.ms_per_example:8.1f}" if floor else f"{'-':>8}"
        shares = ("/".join(f"{100 * s:.0f}" for s in row.shares) if row.shares else "-")
        cpu = (f"{row.cpu_ms:7.2f} {ceiling_per_second(row.cpu_ms):9.1f}"
               if row.cpu_ms is not None else f"{'-':>7} {'-':>9}")
        print(f"{row.mode:48} {row.examples:>8} {row.seconds:8.2f} {row.per_second:10.1f} "
              f"{row.ms_per_example:10.2f} {times} {shares:>19} {cpu}  {row.note}")
    if any(row.shares for row in rows):
        print("ranks/driver/wire: shares of the wall time taken by the slowest rank's steps, "
              "by the driver's CPU (reference, checks, records, sockets; pipelined, it "
              "overlaps the ranks), and the rest (messages in flight, ranks waiting)")
    if any(row.cpu_ms is not None for row in rows):
        print(f"cpu ms: CPU time per example of every process of the row (ranks, driver, "
              f"sandbox), all threads; cpu cap/s: the most examples/s the {cores()} cores "
              f"allow that work even with perfect overlap")


def _env() -> dict[str, str]:
    import os

    return dict(os.environ, OMP_NUM_THREADS="1")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness.bench")
    parser.add_argument("--examples", type=int, default=400)
    parser.add_argument("--spawned", type=int, default=5)
    parser.add_argument("--batch", type=int, default=BATCH_SIZE,
                        help="examples per round trip in the batched persistent row")
    parser.add_argument("--detection-seeds", "--seeds", type=int, default=3,
                        help="fresh random seeds per variant for time to detection (0: skip "
                        "that table)")
    parser.add_argument("--detection-budget", "--budget", type=float, default=60.0,
                        metavar="S", help="seconds of search per seed and variant")
    parser.add_argument("--detection-column", choices=[*COLUMNS, "both"],
                        help="only the detection table, only this column: steered (each "
                        "variant's own search) or reference (its bug under the reference's "
                        "search); default: both columns, after the other tables")
    parser.add_argument("--worlds", default="sim,torchrun",
                        help="worlds to time detection on")
    parser.add_argument("--variants", help="planted bugs to time detection of (default: all)")
    parser.add_argument("--sim-only", action="store_true",
                        help="throughput of the sim world only (in process and sandboxed)")
    parser.add_argument("--detection-only", action="store_true",
                        help="only the table of time to detection")
    parser.add_argument("--dp4-examples", type=int, default=200,
                        help="examples through each DP 4 layout (0: skip those rows)")
    parser.add_argument("--rebuild-rounds", type=int, default=5,
                        help="failures per rebuild row (cold start, soft, hard with and "
                        "without a spare; 0: skip those rows)")
    parser.add_argument("--rebuilds-only", action="store_true",
                        help="only the rebuild rows")
    parser.add_argument("--staging-draws", type=int, default=DRAWS, metavar="N",
                        help="distinct steps per skew shape behind the staging table (0: "
                        "skip that table)")
    parser.add_argument("--staging-only", action="store_true",
                        help="only the staging table: split steps keeping their FULL replay "
                        "under real-token staging vs the fixed guard (decisions, no world)")
    parser.add_argument("--reach-seconds", type=float, default=30.0, metavar="S",
                        help="seconds of the reference fuzz on the sim world behind the reach "
                        "table (0: skip that table)")
    parser.add_argument("--reach-only", action="store_true",
                        help="only the reach table of the reference search")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo",
                        help="the torchrun world's backend in the throughput, floor and "
                        "rebuild rows (nccl: on a GPU, ranks sharing it where there are "
                        "fewer GPUs)")
    add_schedule_arguments(parser)
    parser.add_argument("--exec-examples", type=int, default=40, metavar="N",
                        help="fault-free examples of the --exec vllm rows (0 skips them; "
                        "harness/bench/exec_costs.py)")
    parser.add_argument("--exec-against", metavar="DIR",
                        help="an older checkout whose --exec vllm rows print beside these")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _check_detection(parser, args)
    if args.detection_column:
        print_detection_table(args)
        return 0
    if args.rebuild_rounds < 0:
        parser.error(f"--rebuild-rounds: a count of failures, not {args.rebuild_rounds}")
    if args.exec_examples < 0:
        parser.error(f"--exec-examples: a count of examples, not {args.exec_examples}")
    if not (math.isfinite(args.reach_seconds) and args.reach_seconds >= 0):
        parser.error(f"--reach-seconds: seconds of fuzzing, 0 or more, not {args.reach_seconds}")
    if args.reach_only:
        if not args.reach_seconds:
            parser.error("--reach-seconds: 0 skips the reach table that --reach-only asks for")
        print_reach_table(args.reach_seconds)
        return 0
    if not 1 <= args.batch <= MAX_BATCH:
        parser.error(f"--batch: examples per round trip must be 1 to {MAX_BATCH}, not "
                     f"{args.batch}")
    if args.staging_draws < 0:
        parser.error(f"--staging-draws: a count of steps, not {args.staging_draws}")
    if args.staging_only:
        if not args.staging_draws:
            parser.error("--staging-draws: 0 skips the staging table that --staging-only asks "
                         "for")
        print_staging_table(args.staging_draws)
        return 0
    if args.rebuilds_only:
        print_all_rebuilds(args.backend, args.rebuild_rounds or 5)
        return 0
    examples = decode_examples(args.examples)
    if args.sim_only:
        print_rows(sim_rows(examples), None)
        return 0
    if not args.detection_only:
        print_throughput(examples, args.spawned, args.batch, args.backend)
        if args.dp4_examples:
            print_dp4(dp4_rows(args.dp4_examples))
        if args.rebuild_rounds:
            print_all_rebuilds(args.backend, args.rebuild_rounds)
        if args.exec_examples > 0:
            from harness.bench.exec_costs import print_exec_costs

            print_exec_costs(args.exec_examples, args.exec_against)
        if args.staging_draws:
            print_staging_table(args.staging_draws)
        if args.reach_seconds:
            print_reach_table(args.reach_seconds)
        print_schedule_costs(parser, args)
    if args.detection_seeds:
        print_detection_table(args)
    return 0


def _check_detection(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The detection table's flags: one line naming the bad one, exit 2."""
    if args.detection_seeds < 0:
        parser.error(f"--detection-seeds: a count of seeds, not {args.detection_seeds}")
    if args.detection_column and not args.detection_seeds:
        parser.error("--detection-seeds: 0 skips the detection table that --detection-column "
                     "asks for")
    if not (math.isfinite(args.detection_budget) and args.detection_budget > 0):
        parser.error(f"--detection-budget: seconds per seed, more than 0, not "
                     f"{args.detection_budget}")
    unknown = [n for n in (args.variants or "").split(",") if n and n not in timed_variants()]
    if unknown:
        parser.error(f"--variants: no planted bug named {unknown[0]!r} (one of "
                     f"{', '.join(timed_variants())})")
    worlds = [w for w in args.worlds.split(",") if w not in ("sim", "torchrun")]
    if worlds:
        parser.error(f"--worlds: no world named {worlds[0]!r} (sim, torchrun)")


def print_detection_table(args: argparse.Namespace) -> None:
    """Time to detection of the chosen bugs, fresh random seeds, on each world asked for."""
    columns = COLUMNS if args.detection_column in (None, "both") else (args.detection_column,)
    names = tuple(args.variants.split(",")) if args.variants else None
    seeds = random_seeds(args.detection_seeds)
    print(f"\ntime to detection from an empty example database, seeds {seeds}, "
          f"{args.detection_budget:g} s per seed:", flush=True)
    rows = [row for world in args.worlds.split(",")
            for row in detection_rows(world, seeds, args.detection_budget, names, columns)]
    print_detection(rows)


def print_all_rebuilds(backend: str, rounds: int) -> None:
    """The torchrun world's rebuild rows on `backend`; the sandbox's beside them on gloo."""
    sandbox = sandbox_rows(rounds=rounds) if backend == "gloo" else []
    print_rebuilds(rebuild_rows(backend, rounds=rounds) + sandbox)


def print_throughput(examples: list[Scenario], spawned_count: int,
                     batch_size: int = BATCH_SIZE, backend: str = "gloo") -> None:
    """The torchrun rows on `backend`; the sim world's rows beside them on gloo only."""
    floor = collective_floor(len(examples), backend)
    batched, extra = persistent(examples, batch_size, backend)
    steady, extra_one = persistent(examples, backend=backend)
    spawned = spawn_per_example(examples[:spawned_count], backend)
    sims = sim_rows(examples) if backend == "gloo" else []
    print_rows([batched, steady, spawned, floor, *sims], floor)
    for name, value in {**extra, **extra_one}.items():
        print(f"{name}: {value:.2f}")


if __name__ == "__main__":
    sys.exit(main())
