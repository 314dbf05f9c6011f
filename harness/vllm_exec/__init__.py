"""vLLM's own execution code (its UBatchRunner, ubatching contexts and ModelCudaGraphManager)
running the step every rank decided, over the miniature MoE (`execution: vllm`).

Importing this package does not import vLLM: the runtime is loaded by the first rank that
needs it (harness/vllm_exec/runtime.py)."""

from harness.config import Execution
from harness.sut.executions import register_execution


def _runtime_class() -> type:
    from harness.vllm_exec.runtime import VllmExecRuntime

    return VllmExecRuntime


register_execution(Execution.VLLM, _runtime_class)
