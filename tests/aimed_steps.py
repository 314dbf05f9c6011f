"""Steps aimed at the microbatched twin of one capture size G: uniform decodes on every rank
past the last region start of G, and a light rank on or beside that start, where the guard
chooses between the twin and eager. The decision properties assert under those branches, so
their examples are drawn there, beside the plain `steps` for breadth."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from harness.config import CudaGraphMode, Guard, HarnessConfig
from harness.gen.strategies import configs, laid_out, steps
from harness.spec.decision import graph_table, last_region_start

TWIN_MODES = (CudaGraphMode.FULL, CudaGraphMode.FULL_AND_PIECEWISE,
              CudaGraphMode.FULL_DECODE_ONLY)
LIGHT_OFFSETS = (None, -1, 0, 1)  # None: no light rank; else its offset from the last start


@st.composite
def twin_configs(draw, guards: Sequence[Guard] = (Guard.FIXED,)) -> HarnessConfig:
    """A wide config given a capture size G that every rank can fill with decodes, its decode
    threshold below G's last region start: G's twin is reachable and the guard's edge splits."""
    config = draw(configs(guards=tuple(guards), modes=TWIN_MODES))
    k = config.num_ubatches
    g = draw(st.integers(2 * k + 2, config.serving.max_num_batched_tokens))
    return config.with_changes(
        capture_sizes=tuple(sorted({*config.cudagraph_capture_sizes, g})),
        max_num_reqs=max(config.serving.max_num_reqs, g),
        decode_threshold=draw(st.integers(k, last_region_start(g, k) - 1)))


@st.composite
def twin_steps(draw, guards: Sequence[Guard] = (Guard.FIXED,),
               light: Sequence[int | None] = LIGHT_OFFSETS):
    """A twin config and uniform decodes between G's last region start and G on every rank,
    but one light rank at the start plus an offset drawn from `light` (None: no light rank)."""
    config = draw(twin_configs(guards))
    k, dp, threshold = config.num_ubatches, config.serving.dp_size, config.serving.decode_threshold
    twins = [d for d in graph_table(config) if d.microbatched and d.uniform_token_count == 1]
    if not twins:  # not expected of a twin config; drawn plainly all the same
        return draw(steps(st.just(config)))
    # Prefer a twin whose last region starts past the threshold: its light rank still splits.
    twin = draw(st.sampled_from([d for d in twins
                                 if last_region_start(d.num_tokens, k) > threshold] or twins))
    top = min(twin.num_tokens, config.serving.max_num_reqs, config.serving.max_num_batched_tokens)
    edge = last_region_start(twin.num_tokens, k)
    low = min(max(edge + 1, threshold), top)
    counts = [draw(st.integers(low, top)) for _ in range(dp)]
    offset = draw(st.sampled_from(tuple(light)))
    if offset is not None:
        counts[draw(st.integers(0, dp - 1))] = max(0, edge + offset)
    return config, [laid_out(config, n, n) for n in counts]


@st.composite
def mostly(draw, aimed: st.SearchStrategy, plain: st.SearchStrategy):
    """Three examples in four from `aimed`, the rest from `plain`."""
    return draw(plain if draw(st.integers(0, 3)) == 0 else aimed)


def aimed_steps(guards: Sequence[Guard] = (Guard.FIXED,),
                light: Sequence[int | None] = LIGHT_OFFSETS) -> st.SearchStrategy:
    return mostly(twin_steps(guards, light), steps(configs(guards=tuple(guards))))
