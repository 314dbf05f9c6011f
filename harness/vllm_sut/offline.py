"""vLLM's decision for every rank of a step with no world: each rank's contribution to the
DP all-reduce is taken from vLLM's own sync (stopped at the all-reduce), summed here, and
handed back to each rank's sync as the all-reduce's result. For exhaustive enumeration and
for holding one vLLM's decisions against another's (`--differential-against base`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from harness.batch import RankBatch
from harness.config import HarnessConfig
from harness.history.decision import StepPlan
from harness.sut.step_plan import plan_step
from harness.vllm_sut.sync import sync_with


class _AllReduceReached(Exception):  # a control-flow signal, not an error
    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__("vLLM's sync reached its all-reduce")
        self.tensor = tensor


@dataclass(frozen=True)
class _StopAtAllReduce:
    """Stands in for the DP group: takes the rank's matrix and stops the sync there; a dead
    rank's is zeros (harness/dead_ranks.py)."""

    silent: bool = False

    def cpu_all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        raise _AllReduceReached(torch.zeros_like(tensor) if self.silent else tensor.clone())


@dataclass(frozen=True)
class _SummedAlready:
    """Stands in for the DP group: the all-reduce's result is known, it is copied in."""

    total: torch.Tensor
    dead_dp_ranks: frozenset[int] = frozenset()  # what this rank was told of (§1.7)

    def cpu_all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor.copy_(self.total)
        return tensor


@lru_cache(maxsize=8192)
def contribution(config: HarnessConfig, rank: int, batch: RankBatch) -> torch.Tensor:
    """What this rank puts into vLLM's all-reduce for `batch` (zeros outside its column)."""
    try:
        sync_with(_StopAtAllReduce(batch.dead), config, rank, batch)
    except _AllReduceReached as reached:
        return reached.tensor
    raise RuntimeError(f"vLLM's sync for rank {rank} returned without an all-reduce "
                       f"(dp_size {config.serving.dp_size})")


def vllm_plans_without_world(config: HarnessConfig,
                             batches: Sequence[RankBatch]) -> list[StepPlan]:
    """Every rank's plan, as vLLM's code for `config` makes it, with no process group; under
    inference mode, as vLLM's runner calls its sync (execute_model), which spares every
    small tensor op of the sync autograd's bookkeeping."""
    with torch.inference_mode():
        total = sum(contribution(config, rank, b) for rank, b in enumerate(batches))
        return [plan_step(config, rank, b, sync_with(
            _SummedAlready(total, frozenset(b.knows_dead)), config, rank, b))
            for rank, b in enumerate(batches)]
