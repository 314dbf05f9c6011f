"""Hypothesis strategies for configs and per-rank batches of one DP step.

Everything is drawn here, in the driver; ranks only ever receive fully drawn inputs.
"""

from __future__ import annotations

from hypothesis import strategies as st

from harness.batch import RankBatch
from harness.config import CudaGraphMode, Guard, HarnessConfig

GRAPH_MODES = (CudaGraphMode.FULL, CudaGraphMode.FULL_DECODE_ONLY,
               CudaGraphMode.FULL_AND_PIECEWISE, CudaGraphMode.NONE)


@st.composite
def configs(draw, *, dp_sizes=(2, 3, 4), ubatch_counts=(2, 3, 4), modes=GRAPH_MODES,
            guards=(Guard.FIXED,), max_tokens: int = 128) -> HarnessConfig:
    """Small microbatching configs; a small space so that graph tables repeat across examples."""
    dp = draw(st.sampled_from(dp_sizes))
    k = draw(st.sampled_from(ubatch_counts))
    sizes = draw(st.lists(st.integers(1, max_tokens), min_size=1, max_size=4, unique=True))
    return HarnessConfig(
        dp_size=dp,
        enable_dbo=k == 2,
        ubatch_size=0 if k == 2 else k,
        cudagraph_mode=draw(st.sampled_from(modes)),
        capture_sizes=tuple(sorted(sizes)),
        # Often every capture size is a uniform-decode size, so that every twin is reachable.
        max_num_reqs=draw(st.one_of(st.integers(1, max_tokens), st.just(max_tokens))),
        max_num_batched_tokens=max_tokens,
        decode_threshold=draw(st.integers(k, max_tokens // 2)),
        prefill_threshold=draw(st.integers(k, max_tokens)),
        top_k=1,
        guard=draw(st.sampled_from(guards)),
    )


def boundary_token_counts(config: HarnessConfig) -> list[int]:
    """Token counts where decisions flip: thresholds, capture sizes and region starts, +-1."""
    k = config.num_ubatches
    points = {config.decode_threshold, config.prefill_threshold}
    for size in config.cudagraph_capture_sizes:
        points.add(size)
        points.update((size // k) * i for i in range(1, k))
    near = {p + d for p in points for d in (-1, 0, 1)}
    return sorted(n for n in near if 1 <= n <= config.max_num_batched_tokens)


def token_counts(config: HarnessConfig, upper: int) -> st.SearchStrategy[int]:
    """Counts in [1, upper], half of them pulled onto the boundaries that matter."""
    boundaries = [n for n in boundary_token_counts(config) if n <= upper]
    uniform = st.integers(1, upper)
    return st.one_of(uniform, st.sampled_from(boundaries)) if boundaries else uniform


@st.composite
def rank_batch(draw, config: HarnessConfig) -> RankBatch:
    """One rank's batch: idle, uniform decode, or mixed (any query lengths), legal for config."""
    kind = draw(st.sampled_from(("decode", "decode", "decode", "mixed", "idle")))
    allow = draw(st.booleans()) if draw(st.integers(0, 9)) == 0 else True
    if kind == "idle":
        return RankBatch.uniform(0, allow_ubatching=allow)
    if kind == "decode":
        n = draw(token_counts(config, min(config.max_num_reqs, config.max_num_batched_tokens)))
        return RankBatch.uniform(n, 1, allow_ubatching=allow)
    n = draw(token_counts(config, config.max_num_batched_tokens))
    reqs = draw(st.integers(1, min(n, config.max_num_reqs)))
    return RankBatch.uniform(n, None, num_reqs=reqs, allow_ubatching=allow)


@st.composite
def steps(draw, config_strategy=None) -> tuple[HarnessConfig, list[RankBatch]]:
    """A config and one batch per rank."""
    config = draw(config_strategy if config_strategy is not None else configs())
    batches = [draw(rank_batch(config)) for _ in range(config.dp_size)]
    return config, batches
