"""vLLM's decision and execution code, registered in the slots of the rank code
(harness/sut/systems.py, harness/sut/executions.py). Every world calls this as it opens,
and so does every process that hosts ranks: a rank of `sut: vllm` or `execution: vllm`, and
a driver judging one, find vLLM's code there. Neither import loads vLLM itself."""

from __future__ import annotations


def register_vllm_code() -> None:
    import harness.vllm_exec  # registers vLLM's runner for execution=vllm
    import harness.vllm_sut  # noqa: F401 - registers vLLM's decision code for sut=vllm
