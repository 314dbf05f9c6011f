"""The DP table of `make bench-gpu`: a torchrun world of N ranks over NCCL, per rank, per
decode size, the eager microbatched step against the microbatched FULL replay with the real
NCCL all-to-alls inside; the DP sync's cost; the time to start the world and capture.

    python -m harness.bench.gpu_dp [--nproc 2] [--sizes 8,32,128,512] [--iters 30]

The driver launches `torchrun` on this module with `--rank`; every rank joins the group as
the torchrun world's workers do (round-robin on the GPUs, sharing them when there are fewer
GPUs than ranks), captures its graphs, times its steps in lockstep with its peers (every
step is a collective, so each rank's time includes waiting for the slowest), and writes a
JSON file the driver prints as one table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

RUN_TIMEOUT_S = 540


@dataclass(frozen=True)
class RankTimes:
    rank: int
    device: str
    start_s: float  # launch to the group being ready (torchrun, import torch, CUDA, NCCL)
    capture_s: float  # every FULL graph of the config captured (warmups included)
    graphs: int
    import_s: float  # importing vLLM's execution modules (0 under the harness's execution)
    sync_ms: float  # the DP sync: one gloo all-reduce of the matrix plus the decision
    sizes: tuple[tuple[int, float, float], ...]  # (tokens, eager ub ms, FULL ub replay ms)


def _rank_main(args: argparse.Namespace) -> int:
    import torch.distributed as dist

    from harness.batch import RankBatch
    from harness.bench.timing import timed
    from harness.config import HarnessConfig
    from harness.sut import systems
    from harness.world.torchrun.worker import join_group, wait_for_every_rank

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    wait_for_every_rank(world_size)
    device = join_group(args.backend, "cuda" if args.backend == "nccl" else "cpu", 120.0)
    group = dist.group.WORLD
    joined = time.time()
    if args.execution == "vllm":  # vLLM's import is timed apart from its capture
        from harness.vllm_exec import runtime_class

        runtime_class()
    ready = time.time()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    config = HarnessConfig.of(dp_size=world_size, capture_sizes=sizes, max_num_reqs=max(sizes),
                              max_num_batched_tokens=max(sizes), decode_threshold=min(sizes),
                              prefill_threshold=max(sizes), execution=args.execution)
    runtime = _runtime(config, rank, group, device)
    startup = runtime.startup()
    if startup.error is not None:
        raise RuntimeError(f"rank {rank} capture failed: {startup.error.describe()}")
    captured = time.time()
    rows = (_vllm_rows if args.execution == "vllm" else _harness_rows)(
        runtime, config, sizes, rank, args)
    batch = RankBatch.from_query_lens((1,) * sizes[-1])
    sync = timed(lambda: systems.decide(group, config, rank, batch, 60.0),
                 runtime.device, args.warmup, args.iters)
    times = RankTimes(rank, str(device), joined - args.launched, captured - ready,
                      len(startup.graphs), ready - joined, sync, tuple(rows))
    Path(args.out, f"rank-{rank}.json").write_text(json.dumps(asdict(times)))
    os._exit(0)  # no destroy_process_group: it hangs with ranks sharing a GPU


def _runtime(config, rank: int, group, device: str):
    if config.uses_vllm:
        from harness.vllm_exec import runtime_class

        return runtime_class()(config, rank, group, device=device, collective_timeout_s=60.0,
                               hang_timeout_s=90.0)
    from harness.sut.rank_runtime import RankRuntime

    return RankRuntime(config, rank, group, device=device, collective_timeout_s=60.0,
                       hang_timeout_s=90.0)


def _requests(config, n: int, rank: int):
    from harness.batch import RankBatch
    from harness.scenario import Scenario

    lens = (1,) * n
    ranks = (RankBatch.from_query_lens(lens),) * config.serving.dp_size
    return lens, Scenario(config, (ranks,)).requests()[0][rank]


def _harness_rows(runtime, config, sizes, rank: int, args) -> list[tuple[int, float, float]]:
    """The harness's own execution: its microbatch ring eager, and its twin's replay."""
    from harness.bench.timing import timed

    manager, runner = runtime.manager, runtime.runner
    rows = []
    for n in sizes:
        lens, requests = _requests(config, n, rank)
        twin = next(d for d in manager.captured if d.num_tokens == n and d.microbatched)
        graph = manager.captured[twin]
        graph.buffers.fill(requests)
        eager_buffers = runtime._eager_buffers(n, n, requests)

        def replay(graph=graph, lens=lens) -> None:
            runner.prepare(graph.buffers, lens)
            graph.graph.replay()

        eager = timed(lambda twin=twin, b=eager_buffers, lens=lens: manager.run_eager(
            twin, b, lens), runtime.device, args.warmup, args.iters)
        full = timed(replay, runtime.device, args.warmup, args.iters)
        rows.append((n, eager, full))
    return rows


def _vllm_rows(runtime, config, sizes, rank: int, args) -> list[tuple[int, float, float]]:
    """vLLM's execution: its UBatchRunner's threads eager (prepare + run), and its graph
    manager's replay of the microbatched twin (prepare + run_fullgraph)."""
    from harness.bench.timing import timed
    from harness.config import CudaGraphMode
    from harness.history.decision import GraphDescriptor

    rows = []
    for n in sizes:
        _, requests = _requests(config, n, rank)
        twin = next(d for d in runtime.table.capture_order()
                    if d.cg_mode is CudaGraphMode.FULL and d.num_tokens == n and d.microbatched)
        eager_ub = GraphDescriptor(CudaGraphMode.NONE, n, n, num_ubatches=twin.num_ubatches)
        eager = timed(lambda d=eager_ub, r=requests: runtime.execute(d, r), runtime.device,
                      args.warmup, args.iters)
        full = timed(lambda d=twin, r=requests: runtime.execute(d, r), runtime.device,
                     args.warmup, args.iters)
        rows.append((n, eager, full))
    return rows


def run_dp_bench(nproc: int, sizes: str, warmup: int, iters: int, execution: str = "harness",
                 backend: str = "nccl") -> list[RankTimes]:
    """Launch the ranks, wait for them (bounded), and read back every rank's times."""
    root = str(Path(__file__).resolve().parents[1])
    with tempfile.TemporaryDirectory(prefix="dbo-bench-dp-") as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", "--max-restarts=0", "-m", "harness.bench.gpu_dp",
               "--rank", "--out", out, "--sizes", sizes, "--warmup", str(warmup),
               "--iters", str(iters), "--launched", repr(time.time()), "--exec", execution,
               "--backend", backend]
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S, start_new_session=True)
        files = sorted(Path(out).glob("rank-*.json"))
        if done.returncode != 0 or len(files) != nproc:
            raise RuntimeError(f"the DP bench failed (exit {done.returncode}):\n"
                               f"{(done.stdout + done.stderr)[-3000:]}")
        return [_rank_times(json.loads(f.read_text())) for f in files]


def _rank_times(data: dict) -> RankTimes:
    return RankTimes(**{**data, "sizes": tuple(tuple(row) for row in data["sizes"])})


def print_dp_table(ranks: list[RankTimes], layout: str, iters: int, execution: str = "harness",
                   file=sys.stdout) -> None:
    runs = {"harness": "the harness's own microbatch runner and graph manager",
            "vllm": "vLLM's UBatchRunner and ModelCudaGraphManager"}[execution]
    print(f"DP={len(ranks)} world, {layout}; {runs}; median of {iters} steps, ms, per rank",
          file=file)
    print(f"{'tokens':>6}  " + "  ".join(
        f"{'r' + str(r.rank) + ' eager ub':>11}  {'r' + str(r.rank) + ' FULL ub':>10}  "
        f"{'speedup':>7}" for r in ranks), file=file)
    for i, (n, *_rest) in enumerate(ranks[0].sizes):
        cells = []
        for r in ranks:
            _, eager, full = r.sizes[i]
            cells.append(f"{eager:>11.3f}  {full:>10.3f}  {eager / full:>6.1f}x")
        print(f"{n:>6}  " + "  ".join(cells), file=file)
    for r in ranks:
        print(f"rank {r.rank} on {r.device}: DP sync {r.sync_ms:.3f} ms; world start "
              f"{r.start_s:.1f} s; "
              + (f"vLLM import {r.import_s:.1f} s; " if r.import_s else "")
              + f"capture of {r.graphs} graphs {r.capture_s:.1f} s", file=file)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.bench.gpu_dp", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--sizes", default="8,32,128,512")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--exec", dest="execution", choices=("harness", "vllm"),
                        default="harness", help="whose execution code runs the steps")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl",
                        help=argparse.SUPPRESS)  # gloo: the rank code debugged on a CPU
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--launched", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank:
        return _rank_main(args)
    from harness.errors import ConfigError
    from harness.world.torchrun.backends import check_backend

    try:
        layout = check_backend(args.backend, args.nproc)
        [int(s) for s in args.sizes.split(",")]
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.execution == "vllm":
        from harness.vllm_sut.available import unavailable_reason, vllm_version

        if vllm_version() is None:
            print(f"vLLM's execution table skipped: {unavailable_reason()}")
            return 0
    print_dp_table(run_dp_bench(args.nproc, args.sizes, args.warmup, args.iters,
                                args.execution, args.backend),
                   layout.describe() if args.backend == "nccl" else "gloo on CPU",
                   args.iters, args.execution)
    return 0


if __name__ == "__main__":
    sys.exit(main())
