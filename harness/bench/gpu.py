"""`python -m harness.bench.gpu`: the miniature MoE on the single-rank GPU world, at decode
sizes, four ways, and the graph pool memory each capture takes. One table.

Per decode size n (n single-token requests, the step padded to the capture size n):
- eager: the whole step on the main thread (`run_eager` of the non-split descriptor);
- eager ub: the step microbatched on the threads with their handoffs and the NCCL
  all-to-alls waited from the host (bounded), as an eager microbatched step runs;
- FULL: the captured whole-step graph replayed;
- FULL ub: the captured microbatched graph (threads and all-to-alls inside) replayed.
Each timing covers writing the step's metadata and running it (eager) or replaying it (the
inputs are already in the buffers, as after `StepBuffers.fill`); the median over `--iters`
runs after `--warmup` runs, timed with CUDA events on the stream the step is issued on.

Memory: per captured graph, the most its capture held at once in the graph pool (peak
allocated minus allocated before) and how much the shared pool grew (memory reserved, after
emptying the cache first as torch.cuda.graph does; captures go largest first, so smaller
graphs mostly reuse the pool); then, on a config that captures every twin
(`twins="all"`) with max_num_reqs below the largest capture size, what the twins no batch
can reach hold (pool growth during their capture plus their persistent step buffers).

`--device cpu` runs the same code on the CPU (gloo, emulated graphs, wall-clock timing) to
debug the bench without a GPU; its numbers mean nothing for the GPU.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from harness.batch import RankBatch
from harness.bench import gpu_dp
from harness.bench.timing import timed
from harness.history.decision import GraphDescriptor
from harness.model.step_buffers import prepare_microbatch
from harness.scenario import Scenario
from harness.sut.rank_runtime import RankRuntime
from harness.world.gpu.group import single_rank_cpu_group
from harness.world.gpu.world import open_single_rank_gpu_world, single_rank_config

SIZES = (8, 16, 32, 64, 128, 256, 512)
GOAL = 3.0  # microbatched FULL replay vs eager microbatched, as the issue states


def bench_config(sizes=SIZES, **fields):
    largest = max(sizes)
    base = {"capture_sizes": tuple(sizes), "max_num_reqs": largest,
            "max_num_batched_tokens": largest, "decode_threshold": min(sizes),
            "prefill_threshold": largest}
    return single_rank_config(**{**base, **fields})


# -- memory ------------------------------------------------------------------------------------

@dataclass
class CaptureMemory:
    peak: int  # most bytes the capture's allocations held at once (what it needs of the pool)
    reserved: int  # bytes the device memory reserved grew by (the shared pool's growth)


@dataclass
class MeasuredGraphs:
    """A graph backend that notes the memory each capture takes, keyed by graph object."""

    inner: object
    device: torch.device
    taken: dict[int, CaptureMemory] = field(default_factory=dict)

    def new_pool(self):
        return self.inner.new_pool()

    def new_graph(self):
        return self.inner.new_graph()

    @contextmanager
    def capture(self, graph, stream, pool=None) -> Iterator[object]:
        cuda = self.device.type == "cuda"
        if cuda:
            # torch.cuda.graph empties the cache on entry: do it first, so the growth
            # measured is the capture's own.
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            allocated = torch.cuda.memory_allocated(self.device)
            reserved = torch.cuda.memory_reserved(self.device)
        with self.inner.capture(graph, stream, pool=pool) as captured:
            yield captured
        if cuda:
            torch.cuda.synchronize(self.device)
            self.taken[id(graph)] = CaptureMemory(
                torch.cuda.max_memory_allocated(self.device) - allocated,
                torch.cuda.memory_reserved(self.device) - reserved)
        else:
            self.taken[id(graph)] = CaptureMemory(0, 0)


def measured_runtime(config, group, device: torch.device) -> tuple[RankRuntime, MeasuredGraphs]:
    runtime = RankRuntime(config, 0, group, device=str(device), collective_timeout_s=30.0,
                          hang_timeout_s=45.0)
    measured = MeasuredGraphs(runtime.manager.backend, runtime.device)
    runtime.manager.backend = measured
    startup = runtime.startup()
    if startup.error is not None:
        raise RuntimeError(f"capture failed: {startup.error.describe()}")
    return runtime, measured


def graph_memory(runtime: RankRuntime, measured: MeasuredGraphs,
                 desc: GraphDescriptor) -> CaptureMemory:
    return measured.taken[id(runtime.manager.captured[desc].graph)]


# -- timing ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SizeRow:
    tokens: int
    eager_ms: float
    eager_ub_ms: float
    full_ms: float
    full_ub_ms: float
    full_mem: CaptureMemory
    full_ub_mem: CaptureMemory

    @property
    def ub_speedup(self) -> float:
        return self.eager_ub_ms / self.full_ub_ms if self.full_ub_ms else 0.0


def descriptors_of(runtime: RankRuntime, n: int) -> tuple[GraphDescriptor, GraphDescriptor]:
    found = [d for d in runtime.manager.captured if d.num_tokens == n]
    whole = [d for d in found if not d.microbatched]
    split = [d for d in found if d.microbatched]
    if not whole or not split:
        raise RuntimeError(f"no whole-step graph and twin captured at {n} tokens: "
                           f"{[d.label() for d in found]}")
    return whole[0], split[0]


def bench_size(runtime: RankRuntime, measured: MeasuredGraphs, n: int, warmup: int,
               iters: int) -> SizeRow:
    manager, runner = runtime.manager, runtime.runner
    lens = (1,) * n
    requests = Scenario(runtime.config, ((RankBatch.from_query_lens(lens),),)).requests()[0][0]
    whole, split = descriptors_of(runtime, n)
    eager_buffers = runtime._eager_buffers(n, n, requests)
    g_whole, g_split = manager.captured[whole], manager.captured[split]
    g_whole.buffers.fill(requests)
    g_split.buffers.fill(requests)

    def replay_whole() -> None:
        b = g_whole.buffers
        prepare_microbatch(b, manager.whole_step_meta, b.whole())
        g_whole.graph.replay()

    def replay_split() -> None:
        runner.prepare(g_split.buffers, lens)
        g_split.graph.replay()

    device = runtime.device
    return SizeRow(
        n,
        timed(lambda: manager.run_eager(whole, eager_buffers, lens), device, warmup, iters),
        timed(lambda: manager.run_eager(split, eager_buffers, lens), device, warmup, iters),
        timed(replay_whole, device, warmup, iters),
        timed(replay_split, device, warmup, iters),
        graph_memory(runtime, measured, whole), graph_memory(runtime, measured, split))


@dataclass(frozen=True)
class TwinWaste:
    labels: tuple[str, ...]
    pool_peak: int
    pool_reserved: int
    step_buffers: int
    reachable_twins: int


def unreachable_twin_memory(group, device: torch.device, sizes, max_num_reqs: int) -> TwinWaste:
    config = bench_config(sizes, twins="all", max_num_reqs=max_num_reqs)
    runtime, measured = measured_runtime(config, group, device)
    dead, reachable = [], 0
    for desc in runtime.manager.captured:
        if not desc.microbatched:
            continue
        if runtime.table.reaching_batch_size(desc) is None:
            dead.append(desc)
        else:
            reachable += 1
    mems = [graph_memory(runtime, measured, d) for d in dead]
    return TwinWaste(tuple(d.label() for d in dead), sum(m.peak for m in mems),
                     sum(m.reserved for m in mems),
                     sum(runtime.manager.graph_bytes(d) for d in dead), reachable)


# -- report ------------------------------------------------------------------------------------

def kib(n: int) -> str:
    return f"{n / 1024:.0f}"


def print_table(rows: list[SizeRow], waste: TwinWaste | None, how: str, device: torch.device,
                iters: int, file=sys.stdout) -> None:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"single-rank world on {name} ({how}); median of {iters} steps, ms", file=file)
    header = (f"{'tokens':>6}  {'eager':>8}  {'eager ub':>8}  {'FULL':>8}  {'FULL ub':>8}  "
              f"{'ub speedup':>10}  {'peak KiB FULL':>13}  {'peak KiB FULL ub':>16}  "
              f"{'pool grew KiB FULL ub':>21}")
    print(header, file=file)
    for r in rows:
        print(f"{r.tokens:>6}  {r.eager_ms:>8.3f}  {r.eager_ub_ms:>8.3f}  {r.full_ms:>8.3f}  "
              f"{r.full_ub_ms:>8.3f}  {r.ub_speedup:>9.1f}x  {kib(r.full_mem.peak):>13}  "
              f"{kib(r.full_ub_mem.peak):>16}  {kib(r.full_ub_mem.reserved):>21}",
              file=file)
    met = [r.tokens for r in rows if r.ub_speedup >= GOAL]
    print(f"goal: FULL ub >= {GOAL:.0f}x faster than eager ub: met at {met or 'no size'} "
          f"of {[r.tokens for r in rows]}", file=file)
    if waste is not None:
        print(f"twins no batch can reach (twins=all): {len(waste.labels)} "
              f"{list(waste.labels)}; their captures needed {kib(waste.pool_peak)} KiB of the "
              f"graph pool at peak (it grew {kib(waste.pool_reserved)} KiB), plus "
              f"{kib(waste.step_buffers)} KiB of step buffers ({waste.reachable_twins} twins "
              "reachable)", file=file)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.bench.gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--twin-max-num-reqs", type=int, default=64,
                        help="max_num_reqs of the twins=all config (below the largest size)")
    parser.add_argument("--no-twins", action="store_true", help="skip the twin memory run")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--dp-nproc", type=int, default=2,
                        help="ranks of the DP table's NCCL world (0: no DP table)")
    parser.add_argument("--dp-sizes", default="8,32,128,512")
    args = parser.parse_args(argv)
    try:
        sizes = tuple(int(s) for s in args.sizes.split(","))
    except ValueError:
        print(f"--sizes: not a list of integers: {args.sizes!r}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: the GPU bench needs one (--device cpu debugs it on the CPU)",
              file=sys.stderr)
        return 2
    world = None
    if args.device == "cuda":
        world = open_single_rank_gpu_world(timeout_s=60.0)
        group, device, how = world.group, world.device, world.how
    else:
        group, device, how = single_rank_cpu_group(), torch.device("cpu"), "gloo, emulated"
    try:
        runtime, measured = measured_runtime(bench_config(sizes), group, device)
        rows = [bench_size(runtime, measured, n, args.warmup, args.iters) for n in sizes]
        waste = (None if args.no_twins else
                 unreachable_twin_memory(group, device, sizes, args.twin_max_num_reqs))
        print_table(rows, waste, how, device, args.iters)
    finally:
        if world is not None:
            world.close()
    if args.dp_nproc and args.device == "cuda":
        print()
        sys.stdout.flush()
        dp_args = ["--nproc", str(args.dp_nproc), "--sizes", args.dp_sizes,
                   "--warmup", str(args.warmup), "--iters", str(args.iters)]
        status = gpu_dp.main(dp_args)
        print()
        sys.stdout.flush()
        # The same table under vLLM's own execution code (skipped, with why, without vLLM).
        return status or gpu_dp.main([*dp_args, "--exec", "vllm"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
