"""vLLM's own execution code (its UBatchRunner, ubatching contexts and ModelCudaGraphManager)
running the step every rank decided, over the miniature MoE (`execution: vllm`).

Importing this package does not import vLLM: the runtime is loaded by the first rank that
needs it (harness/vllm_exec/runtime.py)."""

import harness.vllm_sut  # noqa: F401 - chooses vLLM's platform before vLLM is imported
from harness.config import Execution
from harness.sut.executions import register_execution


def runtime_class() -> type:
    """The rank runtime, importing vLLM."""
    from harness.vllm_exec.runtime import VllmExecRuntime

    return VllmExecRuntime


register_execution(Execution.VLLM, runtime_class)
