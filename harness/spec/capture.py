"""The sizes and lengths the spec's graph tables are built from, restated from docs/spec.md
(§0.3 the capture sizes, §1.6 the query lengths drafts give, §2.6 0.34's varlen grid); like
harness/spec/decision.py it shares no code with harness/sut."""

from __future__ import annotations

from harness.config import CudaGraphMode, HarnessConfig

NONE, PIECEWISE, FULL = CudaGraphMode.NONE, CudaGraphMode.PIECEWISE, CudaGraphMode.FULL


def branch_modes(mode: CudaGraphMode) -> tuple[CudaGraphMode | None, CudaGraphMode | None]:
    """(decode branch mode, mixed branch mode) of §2.2 rule 2; None: that branch adds nothing.
    Only the composites have a decode branch; FULL and PIECEWISE use the mixed one alone."""
    return {NONE: (None, None), PIECEWISE: (None, PIECEWISE), FULL: (None, FULL),
            CudaGraphMode.FULL_DECODE_ONLY: (FULL, None),
            CudaGraphMode.FULL_AND_PIECEWISE: (FULL, PIECEWISE)}[mode]


def capture_sizes(config: HarnessConfig) -> list[int]:
    """The capture-size ladder of §0.3: explicit sizes deduplicated and sorted, else vLLM's."""
    if config.serving.cudagraph_mode is NONE:
        return []
    if config.serving.capture_sizes is not None:
        return sorted(set(config.serving.capture_sizes))
    q = config.serving.decode_query_len
    largest = min(2 * config.serving.max_num_reqs * q, 512, config.serving.max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= largest]
    s = 8
    while s < 256 and s <= largest:
        sizes.append(s)
        s += 8
    s = 256
    while s <= largest:
        sizes.append(s)
        s += 16
    budget = config.serving.max_num_batched_tokens
    if budget <= largest and budget not in sizes:
        sizes.append(budget)
    if newest(config) and q > 1:
        # §0.3 (0.34): with drafts, every uniform decode size of the request-count grid.
        ceiling = min(2 * config.serving.max_num_reqs * q, 512, budget)
        top = min(config.serving.max_num_reqs, 512)
        counts = [n for n in (1, 2, 4) if n <= top] + list(range(8, min(top + 1, 256), 8))
        counts += list(range(256, top + 1, 16)) + [top]
        for n in counts:
            if n * q <= ceiling and n * q not in sizes:
                sizes.append(n * q)
    return sorted(sizes)


def newest(config: HarnessConfig) -> bool:
    """Whether the config models 0.34 (§2.6), not 0.33."""
    return config.serving.release.value == "0.34"


def varlen_grid(top: int) -> list[int]:
    """§2.6 (0.34): the token counts of adaptive verification's decode graphs up to `top`."""
    if top <= 0:
        return []
    grid = [1, 2, 4, 8]
    low = 8
    while low < 1024:
        step = low // 4
        t = low + step
        while t <= 2 * low:
            grid.append(t)
            t += step
        low *= 2
    grid += list(range(1024, 4096, 128)) + list(range(4096, top, 256))
    return sorted({t for t in grid if t < top} | {top})


def query_lengths(config: HarnessConfig) -> list[tuple[int, int]]:
    """§1.6: (q, most requests) of every uniform decode length the drafts give a batch."""
    schedule = config.serving.draft_schedule
    if schedule is None:
        return [(config.serving.decode_query_len, config.serving.max_num_reqs)]
    return [tuple(pair) for pair in schedule]


def drafted_length(config: HarnessConfig, num_reqs: int) -> int:
    """§1.6: 1 + the drafts the schedule gives a batch of `num_reqs` requests."""
    for q, most in sorted(query_lengths(config), key=lambda pair: pair[1]):
        if num_reqs <= most:
            return q
    return config.serving.decode_query_len
