"""When a step may be microbatched, and when a microbatched graph must give way to eager."""

from __future__ import annotations

from harness.config import Guard, HarnessConfig
from harness.sut.slicing import split_size


def ubatch_thresholds_met(config: HarnessConfig, num_tokens: int, uniform_decode: bool,
                          decode_threshold: int | None = None) -> bool:
    """vLLM's check_ubatch_thresholds: inclusive `>=`, decode or prefill threshold."""
    if not config.use_ubatching:
        return False
    if uniform_decode:
        threshold = (config.serving.decode_threshold if decode_threshold is None
                     else decode_threshold)
        return num_tokens >= threshold
    return num_tokens >= config.serving.prefill_threshold


def last_region_start(num_tokens: int, num_ubatches: int, split_uct: int | None = None) -> int:
    """First token of the last microbatch region of a step padded to `num_tokens` (cut by
    `split_uct`, slicing.split_uct_of)."""
    return split_size(num_tokens, num_ubatches, split_uct) * (num_ubatches - 1)


def every_region_gets_a_real_token(min_tokens: int, graph_tokens: int, num_ubatches: int,
                                   split_uct: int | None = None) -> bool:
    """True when the smallest rank's real tokens reach into the last region of the split."""
    return min_tokens > last_region_start(graph_tokens, num_ubatches, split_uct)


def guard_sends_to_eager(guard: Guard, min_tokens: int, graph_tokens: int,
                         num_ubatches: int, split_uct: int | None = None) -> bool:
    """The empty-microbatch guard of the DP sync, in the variant the config selects (under the
    staging policy the sync lifts it where staging fills every region, §3.4). The fixed guard
    asks where the graph's split really puts the last region (§4.1)."""
    if guard is Guard.MERGED:
        return 2 * min_tokens < graph_tokens
    if guard is Guard.STRICT_K2:
        return 2 * min_tokens <= graph_tokens
    return not every_region_gets_a_real_token(min_tokens, graph_tokens, num_ubatches, split_uct)
