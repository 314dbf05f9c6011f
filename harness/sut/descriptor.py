"""Whether a captured graph can serve a batch (the rule behind vLLM's graph dispatch)."""

from __future__ import annotations

from harness.history.decision import GraphDescriptor


def is_compatible(desc: GraphDescriptor, *, num_reqs: int, num_tokens: int,
                  uniform_token_count: int | None, max_query_len: int | None = None,
                  num_ubatches: int = 1) -> bool:
    """Whether a graph captured for `desc` can serve this batch (docs/spec.md §2.1)."""
    if desc.uniform_token_count is not None and desc.uniform_token_count != uniform_token_count:
        return False
    if desc.max_query_len is not None and (
            max_query_len is None or desc.max_query_len < max_query_len):
        return False
    if desc.num_reqs is not None and desc.num_reqs < num_reqs:
        return False
    # A graph captured for N microbatches can only serve a batch split N ways.
    return desc.num_tokens >= num_tokens and desc.num_ubatches == num_ubatches
