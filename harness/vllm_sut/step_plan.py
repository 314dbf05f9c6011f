"""The decision phase of a rank with vLLM's functions in place of the harness's miniature."""

from __future__ import annotations

from harness.batch import RankBatch
from harness.config import HarnessConfig
from harness.history.decision import StepPlan
from harness.runtime.comm import CollectiveLog
from harness.sut.step_plan import plan_step
from harness.vllm_sut.sync import vllm_sync


def vllm_decide_on_rank(group, config: HarnessConfig, rank: int, batch: RankBatch,
                        timeout_s: float, log: CollectiveLog | None = None) -> StepPlan:
    """Same contract as harness.sut.step_plan.decide_on_rank, with vLLM 0.33.0 deciding."""
    return plan_step(config, rank, batch, vllm_sync(group, config, rank, batch, timeout_s, log))
