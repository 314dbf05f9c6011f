"""Whose code executes a decided step: the harness's RankRuntime, or another execution
registered here (vLLM's, by `harness.vllm_exec`, which this package never imports)."""

from __future__ import annotations

from collections.abc import Callable

from harness.config import Execution, HarnessConfig
from harness.errors import ConfigError
from harness.sut.rank_runtime import RankRuntime

# Each registered execution gives its runtime class on demand (its imports are heavy).
_EXECUTIONS: dict[Execution, Callable[[], type]] = {Execution.HARNESS: lambda: RankRuntime}


def register_execution(execution: Execution, runtime_class: Callable[[], type]) -> None:
    _EXECUTIONS[execution] = runtime_class


def rank_runtime_class(config: HarnessConfig) -> type:
    """The class a rank builds for `config`: same constructor keywords as RankRuntime, and
    its startup / step / reset_state."""
    runtime_class = _EXECUTIONS.get(config.system.execution)
    if runtime_class is None:
        raise ConfigError("execution", f"no execution code is registered for "
                          f"{config.system.execution.value} in this process")
    return runtime_class()
