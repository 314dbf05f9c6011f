"""The collective floor of `make bench`: run under torchrun with 2 ranks; loops the
collectives of one microbatched decode step (the DP sync all-reduce and the dispatch and
combine all-to-alls of two microbatches) and prints the wall seconds and the ranks' CPU seconds.

    python -m torch.distributed.run --standalone --nproc-per-node=2 \
        -m harness.bench.floor ITERATIONS [gloo|nccl]

With nccl the ranks join their group as the torchrun world's workers do (the sync over gloo
on the CPU, the all-to-alls over NCCL on the GPU, sharing it when there are fewer GPUs)."""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist

from harness.bench.examples import CONFIG
from harness.config import HarnessConfig
from harness.model.comm_buffers import NUM_PROVENANCE_COLS
from harness.runtime.comm import EagerAllToAll, all_reduce_sum
from harness.sut.dp_sync import NUM_ROWS
from harness.world.torchrun.worker import join_group


def main() -> int:
    iterations = int(sys.argv[1])
    backend = sys.argv[2] if len(sys.argv) > 2 else "gloo"
    device = torch.device(join_group(backend, "cuda" if backend == "nccl" else "cpu", 30.0))
    group = dist.group.WORLD
    config = HarnessConfig.of(**CONFIG)
    size = dist.get_world_size()
    rows = size * (config.serving.max_num_batched_tokens * config.model.top_k + 1)
    width = config.model.hidden_size + NUM_PROVENANCE_COLS
    send = torch.zeros(rows, width, dtype=torch.float64, device=device)
    recv = torch.zeros_like(send)
    matrix = torch.zeros(NUM_ROWS, size, dtype=torch.int32)  # the sync stays on the CPU
    exchange = EagerAllToAll(group, 30.0)

    def one_step() -> None:
        all_reduce_sum(group, matrix, 30.0)
        for _ in range(4):  # dispatch and combine of two microbatches
            exchange(recv, send)()

    for _ in range(10):
        one_step()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(iterations):
        one_step()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    # Every rank's CPU, gloo's own threads included, summed onto rank 0 (one line: ranks'
    # prints may interleave on torchrun's shared stdout).
    cpus = torch.tensor([cpu], dtype=torch.float64)
    dist.all_reduce(cpus)
    if dist.get_rank() == 0:
        print(json.dumps({"seconds": elapsed, "cpu": cpus.item(), "iterations": iterations}),
              flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
