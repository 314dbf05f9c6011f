"""The graph descriptor (vLLM's BatchExecutionDescriptor) and its compatibility rule."""

from __future__ import annotations

from dataclasses import dataclass

from harness.config import CudaGraphMode


@dataclass(frozen=True)
class GraphDescriptor:
    """How a step runs: the key of a captured graph, or an eager run (cg_mode NONE).

    LoRA is unsupported with microbatching (dbo-reference 1.5), so there is no LoRA field.
    """

    cg_mode: CudaGraphMode
    num_tokens: int
    num_reqs: int | None = None  # None: no request padding (PIECEWISE)
    uniform_token_count: int | None = None  # None: any per-request query length
    max_query_len: int | None = None
    num_ubatches: int = 1  # 1 means no splitting

    @property
    def microbatched(self) -> bool:
        return self.num_ubatches > 1

    def label(self) -> str:
        parts = [self.cg_mode.name, f"{self.num_tokens}tok"]
        if self.num_reqs is not None:
            parts.append(f"{self.num_reqs}req")
        if self.uniform_token_count is not None:
            parts.append(f"uct{self.uniform_token_count}")
        if self.num_ubatches > 1:
            parts.append(f"ub{self.num_ubatches}")
        return "/".join(parts)


def is_compatible(desc: GraphDescriptor, *, num_reqs: int, num_tokens: int,
                  uniform_token_count: int | None, max_query_len: int | None = None,
                  num_ubatches: int = 1) -> bool:
    """Whether a graph captured for `desc` can serve this batch (dbo-reference 2.2)."""
    if desc.uniform_token_count is not None and desc.uniform_token_count != uniform_token_count:
        return False
    if desc.max_query_len is not None and (
            max_query_len is None or desc.max_query_len < max_query_len):
        return False
    if desc.num_reqs is not None and desc.num_reqs < num_reqs:
        return False
    # A graph captured for N microbatches can only serve a batch split N ways.
    return desc.num_tokens >= num_tokens and desc.num_ubatches == num_ubatches
