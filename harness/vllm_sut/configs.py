"""vLLM's config objects for a HarnessConfig.

Only fields vLLM has are translated: DP size, the microbatch count (enable_dbo / ubatch_size),
the DBO thresholds, the all-to-all backend, the CUDA graph mode and capture sizes, and the
scheduler limits. The harness's variant switches (guard, twins, protocol, capture_on,
threshold offsets) have no vLLM counterpart and are ignored: vLLM is what it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch
from pydantic import ValidationError
from vllm.config import (
    CacheConfig,
    CompilationConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.config.compilation import CUDAGraphMode

from harness.config import HarnessConfig
from harness.errors import ConfigError
from harness.vllm_sut.code import vllm_code

# vLLM field -> harness field, to name the harness field when vLLM rejects a value.
_HARNESS_FIELD = {
    "data_parallel_size": "dp_size",
    "enable_dbo": "enable_dbo",
    "ubatch_size": "ubatch_size",
    "dbo_decode_token_threshold": "decode_threshold",
    "dbo_prefill_token_threshold": "prefill_threshold",
    "all2all_backend": "all2all_backend",
    "max_num_seqs": "max_num_reqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "cudagraph_mode": "cudagraph_mode",
    "cudagraph_capture_sizes": "capture_sizes",
    "enable_fault_tolerance": "fault_tolerance",
}


# VllmConfig methods the capture-size ladder and the graph managers call on the config.
_BORROWED = frozenset({
    "get_decode_cudagraph_query_lens", "get_varlen_decode_cudagraph_token_sizes",
    "get_draft_decode_cudagraph_request_sizes", "_split_cudagraph_capture_sizes",
})


@dataclass(frozen=True)
class _NoModel:
    """Stands in for ModelConfig: the capture-size ladder asks whether eager is forced, and
    0.34's UBatchRunner reads the dtype (the miniature's) before a run."""

    enforce_eager: bool = False
    dtype: torch.dtype = torch.float32


@dataclass(frozen=True)
class VllmConfigSlice:
    """The part of VllmConfig that CudaGraphManager and the capture-size ladder read.

    A real VllmConfig needs a ModelConfig (a Hugging Face model to inspect), and without one
    its __post_init__ turns CUDA graphs off; vLLM's own unit tests use a stand-in the same way.
    """

    parallel_config: ParallelConfig
    scheduler_config: SchedulerConfig
    compilation_config: CompilationConfig
    cache_config: CacheConfig
    # get_num_ubatches of the vLLM code under test (a checkout's or a patched one).
    get_num_ubatches: Callable[[ParallelConfig], int] = field(compare=False, repr=False)
    model_config: _NoModel = _NoModel()
    # Drafts are given by their count alone: no dynamic speculative decoding is modelled.
    speculative_config: None = None
    num_speculative_tokens: int = 0
    uniform_decode_query_len: int = 1
    performance_mode: str = "balanced"

    @property
    def num_ubatches(self) -> int:
        # The same helper the DP sync and the twin generation use.
        return self.get_num_ubatches(self.parallel_config)

    def __getattr__(self, name: str) -> Any:
        # VllmConfig's own helpers that read only the parts above (0.34.0's capture-size
        # split and its decode query lengths), bound to the slice; absent where vLLM lacks them.
        helper = getattr(VllmConfig, name, None) if name in _BORROWED else None
        if helper is None:
            raise AttributeError(f"{type(self).__name__} has no {name}")
        return helper.__get__(self)


def _build(field: str, build: Any, **kwargs: Any) -> Any:
    try:
        return build(**kwargs)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = error.get("loc") or (field,)
        name = _HARNESS_FIELD.get(str(loc[0]), field)
        raise ConfigError(name, f"vLLM rejects it: {error.get('msg', exc)}") from None
    except (ValueError, AssertionError) as exc:
        raise ConfigError(field, f"vLLM rejects it: {exc}") from None


@lru_cache(maxsize=64)
def vllm_configs(config: HarnessConfig) -> VllmConfigSlice:
    """vLLM's configs for `config`; ConfigError (naming the harness field) when vLLM says no.
    Drafts with DBO were refused by HarnessConfig where the release refuses them (0.33)."""
    parallel = _build(
        "num_ubatches", ParallelConfig,
        data_parallel_size=config.serving.dp_size,
        enable_dbo=config.serving.enable_dbo,
        ubatch_size=config.serving.ubatch_size,
        dbo_decode_token_threshold=config.serving.decode_threshold,
        dbo_prefill_token_threshold=config.serving.prefill_threshold,
        all2all_backend=config.serving.all2all_backend.value,
        # Only where asked: 0.33's ParallelConfig has no such field (it is refused there).
        **({"enable_fault_tolerance": True} if config.serving.fault_tolerance else {}),
    )
    scheduler = _build(
        "max_num_batched_tokens", SchedulerConfig.default_factory,
        max_num_seqs=config.serving.max_num_reqs,
        max_num_batched_tokens=config.serving.max_num_batched_tokens,
    )
    # Left out (not None) when the harness has no sizes: vLLM then builds its default ladder.
    sizes = {} if config.serving.capture_sizes is None else {
        "cudagraph_capture_sizes": list(config.serving.capture_sizes)}
    compilation = _build(
        "cudagraph_mode", CompilationConfig,
        cudagraph_mode=CUDAGraphMode[config.serving.cudagraph_mode.name], **sizes,
    )
    q = config.serving.decode_query_len
    configs = VllmConfigSlice(parallel, scheduler, compilation, CacheConfig(),
                              vllm_code(config).ubatch_utils.get_num_ubatches,
                              num_speculative_tokens=q - 1, uniform_decode_query_len=q)
    # vLLM's own ladder: dedupes and filters given sizes, or builds the default ladder,
    # then sets max_cudagraph_capture_size. It mutates the CompilationConfig built above.
    _build("capture_sizes", VllmConfig._set_cudagraph_sizes, self=configs)
    return configs
