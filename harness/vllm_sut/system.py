"""vLLM's decision code in the rank's two slots. vLLM is imported on first use, so that
registering it costs nothing where it is not installed."""

from __future__ import annotations

from collections.abc import Sequence

from harness.batch import RankBatch
from harness.config import DecisionSystem, HarnessConfig
from harness.history.decision import StepPlan
from harness.runtime.comm import CollectiveLog
from harness.sut.graph_table import GraphTable
from harness.sut.systems import DecisionCode, register


def _same_release(config: HarnessConfig) -> None:
    # A checkout given where no vllm is installed must be on the path before vLLM imports.
    from harness.vllm_sut.code import check_same_release, ensure_vllm_importable

    ensure_vllm_importable(config.system.vllm_src)
    check_same_release(config)


def _graph_table(config: HarnessConfig, rank: int) -> GraphTable:
    _same_release(config)
    from harness.vllm_sut.candidates import vllm_capture_order

    return GraphTable(config, rank, vllm_capture_order(config))


def _decide(group, config: HarnessConfig, rank: int, batch: RankBatch, timeout_s: float,
            log: CollectiveLog | None) -> StepPlan:
    from harness.vllm_sut.step_plan import vllm_decide_on_rank

    return vllm_decide_on_rank(group, config, rank, batch, timeout_s, log)


def _plans_without_world(config: HarnessConfig, batches: Sequence[RankBatch]) -> list[StepPlan]:
    _same_release(config)
    from harness.vllm_sut.offline import vllm_plans_without_world

    return vllm_plans_without_world(config, batches)


def _load(config: HarnessConfig) -> None:
    _graph_table(config, 0)  # imports vLLM, loads the config's code, builds its graph manager


register(DecisionSystem.VLLM, DecisionCode(_graph_table, _decide, _plans_without_world, _load))
