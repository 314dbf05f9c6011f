"""vLLM's CudaGraphManager for a HarnessConfig, built without capturing a graph.

Its candidate list (twins included), capture order and dispatch are what a real rank
computes before and after capture; translated into the harness's GraphDescriptor.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace
from unittest import mock

import torch
from vllm.config.compilation import CUDAGraphMode as VllmMode

from harness.config import CudaGraphMode, HarnessConfig
from harness.history.decision import GraphDescriptor
from harness.vllm_sut.code import vllm_code
from harness.vllm_sut.configs import vllm_configs
from harness.vllm_sut.differences import dispatch_candidates, graph_manager_args

# Construction patches two module globals for its duration; one construction at a time.
_BUILD_LOCK = threading.Lock()


@dataclass(frozen=True)
class _UBatchRunnerStandIn:
    """Stands in for UBatchRunner: until capture the manager only asks whether one exists."""

    stage_real_tokens: bool = False


def to_harness(desc) -> GraphDescriptor:
    """vLLM's descriptor as the harness's (LoRA never combines with DBO, so it must be 0)."""
    if desc.num_active_loras:
        raise ValueError(f"{desc} has LoRA adapters, which the harness does not model")
    return GraphDescriptor(CudaGraphMode[desc.cg_mode.name], desc.num_tokens, desc.num_reqs,
                           desc.uniform_token_count, desc.max_query_len, desc.num_ubatches)


@lru_cache(maxsize=64)
def vllm_graph_manager(config: HarnessConfig):
    """The CudaGraphManager a rank builds for `config` (of the vLLM code it names), marked
    captured as vLLM's unit tests do."""
    configs = vllm_configs(config)
    code = vllm_code(config)
    cudagraph_utils = code.cudagraph_utils
    parallel = configs.parallel_config
    # vLLM builds a UBatchRunner only with microbatching on and DP > 1 (maybe_build_ubatch_runner).
    runner = (_UBatchRunnerStandIn()
              if parallel.use_ubatching and parallel.data_parallel_size > 1 else None)
    mode = VllmMode[config.serving.cudagraph_mode.name]
    first_and_last_stage = SimpleNamespace(is_first_rank=True, is_last_rank=True)
    with _BUILD_LOCK, \
            mock.patch.object(cudagraph_utils, "get_pp_group", lambda: first_and_last_stage), \
            mock.patch.object(cudagraph_utils.current_platform, "get_global_graph_pool",
                              lambda: None):
        # No pipeline parallel world and no CUDA graph pool exist on a CPU machine.
        # varlen_decode: what model_runner.py passes when adaptive verification is on.
        manager = cudagraph_utils.CudaGraphManager(
            configs, torch.device("cpu"), mode,
            **graph_manager_args(code.api, configs, config.serving.decode_query_len,
                                 config.serving.draft_schedule),
            varlen_decode=config.serving.varlen_decode, ubatch_runner=runner)
    # Nothing is captured; dispatch only needs to believe capture has finished.
    manager._graphs_captured = True
    return manager


def vllm_capture_order(config: HarnessConfig) -> tuple[GraphDescriptor, ...]:
    """Every descriptor vLLM would capture, in its capture order (PIECEWISE, then FULL)."""
    manager = vllm_graph_manager(config)
    ordered: list[GraphDescriptor] = []
    for mode in (VllmMode.PIECEWISE, VllmMode.FULL):
        ordered.extend(to_harness(d) for d in manager._capture_descs.get(mode, ()))
    return tuple(ordered)


def vllm_dispatch_candidates(config: HarnessConfig, num_tokens: int,
                             uniform_token_count: int | None = None,
                             num_ubatches: int = 1) -> tuple[GraphDescriptor, ...]:
    """The descriptors vLLM tries, in order, for a batch of `num_tokens`."""
    candidates = dispatch_candidates(vllm_code(config).api, vllm_graph_manager(config),
                                     num_tokens, uniform_token_count, num_ubatches)
    return tuple(to_harness(d) for d in candidates)


def vllm_dispatch(config: HarnessConfig, num_reqs: int, num_tokens: int,
                  uniform_token_count: int | None, max_query_len: int | None = None,
                  num_ubatches: int = 1) -> GraphDescriptor:
    """vLLM's dispatch for a batch: the graph it replays, or an eager descriptor."""
    desc = vllm_graph_manager(config).dispatch(
        num_reqs, num_tokens, uniform_token_count, num_active_loras=0,
        max_query_len=max_query_len, num_ubatches=num_ubatches)
    return to_harness(desc)
