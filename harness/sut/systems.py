"""Which decision code a rank runs: the harness's miniature, or another system registered
here (vLLM's, by `harness.vllm_sut`, which this package never imports).

The rank code asks here for its graph table (what it captures) and for its step decision;
everything else (the model, the protocol, the graphs, the checkers) stays the harness's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from harness.batch import RankBatch
from harness.config import DecisionSystem, HarnessConfig
from harness.errors import ConfigError
from harness.history.decision import StepPlan
from harness.runtime.comm import CollectiveLog
from harness.sut.graph_table import GraphTable
from harness.sut.step_plan import decide_on_rank, graph_table_for, plan_without_world


@dataclass(frozen=True)
class DecisionCode:
    """The two slots a system under test fills."""

    graph_table: Callable[[HarnessConfig, int], GraphTable]
    # (group, config, rank, batch, collective timeout, log of the collectives issued) -> plan
    decide: Callable[[object, HarnessConfig, int, RankBatch, float, CollectiveLog | None],
                     StepPlan]
    # (config, every rank's batch) -> every rank's plan, with no world (exhaustive, judges)
    plans_without_world: Callable[[HarnessConfig, Sequence[RankBatch]], list[StepPlan]]
    # Loads the code a config names (vLLM's imports take 12 s on the 2-core machine), so that
    # a world can pay for it before any rank's deadline starts; None: nothing to load.
    load: Callable[[HarnessConfig], object] | None = None


_REGISTERED: dict[DecisionSystem, DecisionCode] = {
    DecisionSystem.HARNESS: DecisionCode(graph_table_for, decide_on_rank, plan_without_world)}


def register(system: DecisionSystem, code: DecisionCode) -> None:
    _REGISTERED[system] = code



def _code(config: HarnessConfig) -> DecisionCode:
    code = _REGISTERED.get(config.system.sut)
    if code is None:
        raise ConfigError("sut", f"no decision code is registered for {config.system.sut.value} in "
                          "this process")
    return code


def load(config: HarnessConfig) -> None:
    """Load the decision code `config` names now, outside every deadline."""
    loader = _code(config).load
    if loader is not None:
        loader(config)


def graph_table(config: HarnessConfig, rank: int) -> GraphTable:
    return _code(config).graph_table(config, rank)


def decide(group, config: HarnessConfig, rank: int, batch: RankBatch, timeout_s: float,
           log: CollectiveLog | None = None) -> StepPlan:
    return _code(config).decide(group, config, rank, batch, timeout_s, log)


def plans_without_world(config: HarnessConfig, batches: Sequence[RankBatch]) -> list[StepPlan]:
    return _code(config).plans_without_world(config, batches)


def reference_config(config: HarnessConfig) -> HarnessConfig | None:
    """The harness's reference behaviour to hold another system to (None: it is the harness)."""
    if config.system.sut is DecisionSystem.HARNESS:
        return None
    return config.with_changes(sut=DecisionSystem.HARNESS, vllm_src=None, vllm_patches=(),
                               differential_against_base=False)


def base_config(config: HarnessConfig) -> HarnessConfig | None:
    """The unpatched vLLM a patched one is held against (`differential_against_base`): the
    same tree without the patches; a checkout without patches against the vllm that imports.
    None when no such comparison was asked for."""
    if not config.system.differential_against_base:
        return None
    system = config.system
    return config.with_changes(vllm_src=system.vllm_src if system.vllm_patches else None,
                               vllm_patches=(), differential_against_base=False)
