"""Which decision code a rank runs: the harness's miniature or the installed vLLM's.

The rank code asks here for its graph table (what it captures) and for its step decision;
everything else (the model, the protocol, the graphs, the checkers) stays the harness's.
vLLM is imported only when a config asks for it.
"""

from __future__ import annotations

from harness.batch import RankBatch
from harness.config import DecisionSystem, HarnessConfig
from harness.sut.graph_table import GraphTable
from harness.sut.step_plan import StepPlan, decide_on_rank, graph_table_for


def graph_table(config: HarnessConfig, rank: int) -> GraphTable:
    if config.sut is DecisionSystem.VLLM:
        from harness.vllm_sut.candidates import vllm_capture_order

        return GraphTable(config, rank, vllm_capture_order(config))
    return graph_table_for(config, rank)


def decide(group, config: HarnessConfig, rank: int, batch: RankBatch,
           timeout_s: float) -> StepPlan:
    if config.sut is DecisionSystem.VLLM:
        from harness.vllm_sut.step_plan import vllm_decide_on_rank

        return vllm_decide_on_rank(group, config, rank, batch, timeout_s)
    return decide_on_rank(group, config, rank, batch, timeout_s)


def reference_config(config: HarnessConfig) -> HarnessConfig | None:
    """The harness's reference behaviour to hold another system to (None: it is the harness)."""
    if config.sut is DecisionSystem.HARNESS:
        return None
    return config.with_changes(sut=DecisionSystem.HARNESS)
