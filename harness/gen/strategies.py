"""Hypothesis strategies for configs, skewed per-rank batches and whole scenarios.

Everything is drawn here, in the driver; ranks only ever receive fully drawn inputs. The
generators know nothing of worlds: they return configs, batches and scenarios.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

from harness.batch import RankBatch, dummy_query_lens
from harness.config import All2AllBackend, CudaGraphMode, Guard, HarnessConfig, ubatching_fields
from harness.errors import ConfigError
from harness.faults import FaultKind
from harness.gen.aim import steps_with_microbatch_threads, straddled_graphs
from harness.gen.deaths import deaths
from harness.gen.drafts import (
    DRAFT_LAYOUTS,
    decode_beside_prefill,
    draft_fields,
    draft_layout,
    draft_schedules,
    drafts_past_the_split,
    uniform_beside_twin,
)
from harness.gen.fault_draws import faults
from harness.gen.guard_room import sizes_with_room
from harness.gen.verify_budget import verified_layout
from harness.scenario import Scenario
from harness.spec.decision import last_region_start
from harness.vllm_code.release import Release

GRAPH_MODES = (CudaGraphMode.FULL, CudaGraphMode.FULL_DECODE_ONLY,
               CudaGraphMode.FULL_AND_PIECEWISE, CudaGraphMode.NONE)

# The fuzzer's config space: few distinct values, so that a persistent world captures each
# config's graphs once and replays them across many examples.
SIZE_CHOICES = (4, 8, 12, 16, 32, 48)
# The newest first: a shrunk example models the release users run.
RELEASES = (Release.V0_34, Release.V0_33)
DECODE_THRESHOLDS = (2, 4, 8, 16)
PREFILL_THRESHOLDS = (4, 16, 32)
FUZZ_MAX_TOKENS = 64
# The straddle shape twice: it is the one that couples ranks across a guard boundary.
# "filled": every rank in the last region of one graph, the batches a microbatched graph replays.
SKEW_SHAPES = ("straddle", "straddle", "uniform", "all-equal", "one-hot", "zipf", "idle",
               "filled")


@st.composite
def configs(draw, *, dp_sizes=(2, 3, 4), ubatch_counts=(2, 3, 4), modes=GRAPH_MODES,
            guards=(Guard.FIXED,), max_tokens: int = 128) -> HarnessConfig:
    """Wide configs for the decision layer alone (no capture): any sizes up to max_tokens."""
    dp = draw(st.sampled_from(dp_sizes))
    k = draw(st.sampled_from(ubatch_counts))
    sizes = draw(st.lists(st.integers(1, max_tokens), min_size=1, max_size=4, unique=True))
    return HarnessConfig.of(
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


@st.composite
def fuzz_configs(draw, fixed: Mapping[str, Any] | None = None, *,
                 dp_sizes: Sequence[int] = (2, 3, 4), ubatch_counts: Sequence[int] = (2, 3, 4),
                 drawn: Mapping[str, st.SearchStrategy] | None = None,
                 drafts_every: int = 0) -> HarnessConfig:
    """Configs from the fuzzer's small space. `fixed` fields (what the user pinned, and the
    variant's planted bug) are kept as given; `drawn` adds strategies for other fields. About
    one config in `drafts_every` (0: none) turns microbatching off and draws draft tokens."""
    fixed, drawn = dict(fixed or {}), dict(drawn or {})

    def pick(name: str, strategy: st.SearchStrategy) -> Any:
        return fixed.pop(name) if name in fixed else draw(strategy)

    def pick_early(name: str, strategy: st.SearchStrategy) -> Any:
        # Fields that shape what is drawn next: a variant's strategy applies at once.
        return fixed.pop(name) if name in fixed else draw(drawn.pop(name, strategy))

    fields: dict[str, Any] = {"dp_size": pick("dp_size", st.sampled_from(dp_sizes))}
    release = Release(pick_early("release", st.sampled_from(RELEASES)))
    fields["release"] = release
    pinned = {key: fixed.pop(key) if key in fixed else draw(drawn.pop(key))
              for key in ("enable_dbo", "ubatch_size") if key in fixed or key in drawn}
    # Before 0.34 microbatching off is the only place draft tokens exist (vLLM rejected
    # speculative decoding with DBO); the last value, so that the simplest config keeps it on.
    drafting = bool((release.spec_decode_with_dbo or not pinned) and drafts_every
                    and draw(st.integers(1, drafts_every)) == drafts_every)
    if drafting and not release.spec_decode_with_dbo:
        pinned = {"enable_dbo": False, "ubatch_size": 0}
    fields.update(pinned or ubatching_fields(draw(st.sampled_from(ubatch_counts))))
    k = HarnessConfig.microbatches_of(fields.get("enable_dbo", True), fields.get("ubatch_size", 0))
    if k == 1 or release.spec_decode_with_dbo:
        fields.update(draft_fields(draw, pick_early, drafting, rarely=k > 1))
    mode = pick("cudagraph_mode", graph_modes(fields.get("varlen_decode", False)))
    sizes = pick("capture_sizes", st.lists(st.sampled_from(SIZE_CHOICES), min_size=1,
                                           max_size=2, unique=True).map(sorted)
                 .flatmap(lambda drawn: sizes_with_room(drawn, k, SIZE_CHOICES)))
    largest = max(sizes) if sizes else FUZZ_MAX_TOKENS
    fields.update(
        cudagraph_mode=mode,
        capture_sizes=tuple(sizes) if sizes is not None else None,
        max_num_batched_tokens=pick("max_num_batched_tokens",
                                    st.just(max(FUZZ_MAX_TOKENS, largest))),
        max_num_reqs=pick("max_num_reqs", request_limits(draw, mode, largest)),
    )
    if release.request_keyed_decode:
        fields["draft_schedule"] = pick("draft_schedule", draft_schedules(
            fields.get("decode_query_len", 1), fields["max_num_reqs"]))
        # One config in three may lose a DP rank (§1.7); the simplest keeps every rank.
        fields["fault_tolerance"] = pick("fault_tolerance", st.integers(0, 2).map(
            lambda v: v == 2))
    fields.update(_thresholds_and_backend(pick, k, mode))
    for name, strategy in drawn.items():
        fields[name] = pick(name, strategy)
    fields.update(fixed)
    try:
        return HarnessConfig.of(**fields)
    except ConfigError:
        assume(False)
        raise  # unreachable: assume(False) rejects the example


def _thresholds_and_backend(pick, k: int, mode) -> dict[str, Any]:
    # Drawn thresholds start at k (lower ones are illegal with microbatching); pinned ones
    # are kept as given, so that a bad pin is reported rather than mended.
    fields = {"decode_threshold": pick("decode_threshold", st.sampled_from(
                  DECODE_THRESHOLDS).map(lambda t: max(t, k))),
              "prefill_threshold": pick("prefill_threshold", st.sampled_from(
                  PREFILL_THRESHOLDS).map(lambda t: max(t, k)))}
    if CudaGraphMode.parse(mode) is CudaGraphMode.NONE:
        fields["all2all_backend"] = pick("all2all_backend", st.sampled_from(
            (All2AllBackend.LOW_LATENCY, All2AllBackend.HIGH_THROUGHPUT)))
    return fields


def graph_modes(varlen_decode: bool) -> st.SearchStrategy:
    """Any of GRAPH_MODES; with varlen decode graphs FULL_AND_PIECEWISE, the one mode whose
    padded mixed steps leave the query-length bound a graph to pick (§1.6): FULL and NONE
    capture no varlen graph, FULL_DECODE_ONLY runs mixed steps eagerly as without them."""
    return st.just(CudaGraphMode.FULL_AND_PIECEWISE) if varlen_decode \
        else st.sampled_from(GRAPH_MODES)


def request_limits(draw, mode: CudaGraphMode | str, largest: int) -> st.SearchStrategy[int]:
    """`max_num_reqs`. Below the largest capture size, twins of the larger graphs have no
    legal batch; strictly between half and all of it (one config in eight), that size's token
    count does not divide by its request count (vLLM's make_dummy spreads the rest)."""
    if draw(st.integers(0, 7)) == 0:
        return st.just(uneven_reqs(largest))
    half = max(1, largest // 2)  # vLLM's default: the largest size is twice max_num_seqs
    # In FULL mode mixed and decode batches replay the same graphs, so there a limit below
    # the largest size decides which graphs any batch reaches: drawn half the time.
    if CudaGraphMode.parse(mode) is CudaGraphMode.FULL and draw(st.booleans()):
        return st.just(half)
    return st.sampled_from((FUZZ_MAX_TOKENS, largest, half))


def uneven_reqs(size: int) -> int:
    """A request limit below `size` that does not divide it (any in (size / 2, size)); 1 for a
    size of 1 or 2, which has none."""
    return size // 2 + 1 if size > 2 else 1


def boundary_token_counts(config: HarnessConfig) -> list[int]:
    """Token counts where decisions flip: thresholds, capture sizes, every region start, +-1,
    and one past the largest capture size (the first batch no graph can hold)."""
    k = config.num_ubatches
    points = {config.serving.decode_threshold, config.serving.prefill_threshold}
    for size in config.cudagraph_capture_sizes:
        points.add(size)
        points.update((size // k) * i for i in range(1, k))
    if config.cudagraph_capture_sizes:
        points.add(config.max_capture_size + 1)
    near = {p + d for p in points for d in (-1, 0, 1)}
    return sorted(n for n in near if 1 <= n <= config.serving.max_num_batched_tokens)


def token_counts(config: HarnessConfig, upper: int) -> st.SearchStrategy[int]:
    """Counts in [1, upper], half of them pulled onto the boundaries that matter."""
    boundaries = [n for n in boundary_token_counts(config) if n <= upper]
    uniform = st.integers(1, upper)
    return st.one_of(uniform, st.sampled_from(boundaries)) if boundaries else uniform


@st.composite
def rank_batch(draw, config: HarnessConfig, tokens: int | None = None) -> RankBatch:
    """One rank's batch: idle, uniform decode, or mixed (any query lengths), legal for config.
    With `tokens` the count is given (the skew shape chose it) and only the layout is drawn."""
    if tokens == 0:
        return laid_out(config, 0, 0, _allows_ubatching(draw))
    kind = draw(st.sampled_from(("decode", "decode", "decode", "mixed") if tokens is not None
                                else ("decode", "decode", "decode", "mixed", "idle")))
    allow = _allows_ubatching(draw)
    if kind == "idle":
        return laid_out(config, 0, 0, allow)
    decode_limit = min(config.serving.max_num_reqs, config.serving.max_num_batched_tokens)
    if kind == "decode" and (tokens is None or tokens <= decode_limit):
        n = tokens if tokens is not None else draw(token_counts(config, decode_limit))
        return laid_out(config, n, n, allow)
    n = tokens if tokens is not None else draw(token_counts(config,
                                                            config.serving.max_num_batched_tokens))
    # Often one long prefill chunk alone, as real mixed traffic has.
    reqs = draw(st.one_of(st.integers(1, min(n, config.serving.max_num_reqs)), st.just(1)))
    return laid_out(config, n, reqs, allow)


def laid_out(config: HarnessConfig, num_tokens: int, num_reqs: int,
             allow_ubatching: bool = True) -> RankBatch:
    """A drawn rank's input, its requests laid out as vLLM's dummy batch lays them (the
    form every world and the reference are given: drawn once, never rebuilt)."""
    return RankBatch.from_query_lens(dummy_query_lens(num_reqs, num_tokens), allow_ubatching,
                                     config.serving.decode_query_len)


def _allows_ubatching(draw) -> bool:
    # One rank in ten sometimes refuses microbatching (vLLM's per-rank should_ubatch).
    return draw(st.booleans()) if draw(st.integers(0, 9)) == 0 else True


@st.composite
def skewed_token_counts(draw, config: HarnessConfig,
                        shapes: Sequence[str] = SKEW_SHAPES) -> list[int]:
    """Per-rank token counts in one of the DP skew shapes of real traffic (of `shapes`)."""
    dp = config.serving.dp_size
    upper = config.serving.max_num_batched_tokens
    count = token_counts(config, upper)
    shape = draw(st.sampled_from(shapes))
    if shape == "straddle" and config.cudagraph_capture_sizes:
        return draw(straddling_token_counts(config))
    if shape == "filled" and config.cudagraph_capture_sizes:
        graph = draw(st.sampled_from(straddled_graphs(config)))
        low = min(last_region_start(graph, max(config.num_ubatches, 2)) + 1, graph)
        return [draw(st.integers(low, graph)) for _ in range(dp)]
    if shape == "uniform":
        return [draw(count) for _ in range(dp)]
    if shape == "all-equal":
        return [draw(count)] * dp
    if shape == "one-hot":
        # One heavy rank, the others nearly idle.
        heavy = draw(st.integers(0, dp - 1))
        light = [draw(st.integers(0, 2)) for _ in range(dp)]
        light[heavy] = draw(count)
        return light
    if shape == "zipf":
        # Rank i of a random order gets top / (i + 1): a long tail of light ranks.
        top = draw(count)
        order = draw(st.permutations(range(dp)))
        return [top // (order[r] + 1) for r in range(dp)]
    idle = draw(st.sets(st.integers(0, dp - 1), min_size=1, max_size=dp - 1))
    return [0 if r in idle else draw(count) for r in range(dp)]


@st.composite
def straddling_token_counts(draw, config: HarnessConfig) -> list[int]:
    """Every rank but one pads to the same capture size G; the light rank sits on a region
    start (G // k) * i of G or next to it. Region starts the microbatching threshold lets
    through are preferred, and half the time the last one, where the guard decides between
    graph and eager (the earlier ones matter to slicing, G / 2 to a literal-2 guard)."""
    graphs = straddled_graphs(config)
    k = max(config.num_ubatches, 2)
    starts = [(g, (g // k) * i) for g in graphs for i in range(1, k)]
    open_starts = [(g, n) for g, n in starts if n >= config.serving.decode_threshold] or starts
    last = [(g, n) for g, n in open_starts if n == last_region_start(g, k)]
    pool = draw(st.sampled_from((open_starts, last))) if last else open_starts
    graph, start = draw(st.sampled_from(pool))
    below = max((g for g in graphs if g < graph), default=0)
    light = max(0, start + draw(st.sampled_from((0, -1, 1))))
    light_rank = draw(st.integers(0, config.serving.dp_size - 1))
    heavy = st.one_of(st.just(graph), st.integers(max(below + 1, start), graph))
    counts = [draw(heavy) for _ in range(config.serving.dp_size)]
    counts[light_rank] = light
    return counts


@st.composite
def skewed_batches(draw, config: HarnessConfig) -> list[RankBatch]:
    """One batch per rank: the token counts of a skew shape, laid out either as a pure
    decode step on every rank (what microbatched graphs serve) or each rank on its own."""
    if config.serving.decode_query_len > 1:
        return draw(draft_batches(config))
    if config.serving.dp_size > 1 and draw(st.integers(0, 7)) == 0:
        mixed = draw(decode_beside_mixed(config))
        if mixed:
            return mixed
    shape = draw(st.sampled_from(SKEW_SHAPES))
    counts = draw(skewed_token_counts(config, (shape,)))
    decode_limit = min(config.serving.max_num_reqs, config.serving.max_num_batched_tokens)
    # The shapes aimed at twins lay out as the uniform decodes a twin replays three times in four.
    aimed = shape in ("straddle", "filled")
    if draw(st.integers(0, 3 if aimed else 1)) > 0 and max(counts) <= decode_limit:
        return [laid_out(config, n, n) for n in counts]
    return [draw(rank_batch(config, n)) for n in counts]


# About one step in this many of a draft config is a decode rank beside a prefill (§1.6).
BOUND_EVERY = 2


@st.composite
def draft_batches(draw, config: HarnessConfig) -> list[RankBatch]:
    """With draft tokens (q = decode_query_len > 1), each rank's skewed token count laid out
    as decodes of 1..q tokens (what varlen decode graphs serve), uniform decodes of exactly q
    (the uniform spec-decode graphs), or a batch with a prefill (no query-length bound), next
    to each other; one step in BOUND_EVERY prefills beside decodes within one graph (where
    the synced bound decides), one in 2 * BOUND_EVERY a split step (a microbatched config draws
    one more split shape, where the cut and the trims act): uniform decodes around a twin's
    last region, or where the config captures no such twin every rank past the threshold; and
    each rank's skip_drafts vote (docs/spec.md §1.6, §4.1, §7.24)."""
    last = 2 * BOUND_EVERY - (1 if config.num_ubatches < 2 else 0)
    shape = draw(st.integers(0, last))  # shrinks toward the plain skew (0)
    split = shape == 1 or shape == 2 * BOUND_EVERY
    shaped = (draw(uniform_beside_twin(config)) or draw(drafts_past_the_split(config)) if split
              else draw(decode_beside_prefill(config)) if shape >= BOUND_EVERY else [])
    if not shaped:
        shaped = [(n, draw(st.sampled_from(DRAFT_LAYOUTS)))
                  for n in draw(skewed_token_counts(config))]
    everyone_skips = draw(st.integers(0, 3)) == 3
    batches, largest = [], max((n for n, _ in shaped), default=0)
    for n, layout in shaped:
        skip = True if everyone_skips else draw(st.booleans())
        allow = _allows_ubatching(draw)
        # Under adaptive verification a budget below the drafts is its common case: one rank
        # in two trims its drafts to a budget (§7.24), three in four of the largest, the rank
        # whose requests a split step cuts (a smaller one's may all sit in one microbatch).
        trims = draw(st.integers(0, 3)) > 0 if n == largest else draw(st.booleans())
        verified = (draw(verified_layout(config, n)) if config.serving.varlen_decode
                    and trims else None)
        lens, scheduled = verified or (draft_layout(config, n, layout, draw), None)
        batches.append(RankBatch.from_query_lens(lens, allow, config.serving.decode_query_len,
                                                 skip, scheduled))
    return batches


@st.composite
def decode_beside_mixed(draw, config: HarnessConfig) -> list[RankBatch]:
    """Uniform decodes on some ranks beside mixed batches on the others, every rank past the
    decode threshold and within one capture size: here the synced uniform-decode count and
    the all-ranks uniform-decode test (docs/spec.md §1.2) decide the split and the graph.
    Empty where the config leaves no such step."""
    sizes = config.cudagraph_capture_sizes
    decode_limit = min(config.serving.max_num_reqs, config.serving.max_num_batched_tokens)
    top = min(draw(st.sampled_from(sizes)) if sizes else decode_limit, decode_limit)
    low = max(config.serving.decode_threshold, 2)  # a mixed batch needs two tokens
    if low > top:
        return []
    near = [n for n in boundary_token_counts(config) if low <= n <= top]
    count = st.one_of(st.integers(low, top), st.sampled_from(near)) if near else \
        st.integers(low, top)
    decoders = draw(st.sets(st.integers(0, config.serving.dp_size - 1), min_size=1,
                            max_size=config.serving.dp_size - 1))
    batches = []
    for rank in range(config.serving.dp_size):
        n = draw(count)
        reqs = n if rank in decoders else draw(st.integers(1, min(n - 1,
                                                                  config.serving.max_num_reqs)))
        batches.append(laid_out(config, n, reqs))
    return batches


@st.composite
def steps(draw, config_strategy=None) -> tuple[HarnessConfig, list[RankBatch]]:
    """A config and one batch per rank (no skew shape: each rank drawn on its own)."""
    config = draw(config_strategy if config_strategy is not None else configs())
    batches = [draw(rank_batch(config)) for _ in range(config.serving.dp_size)]
    return config, batches


@st.composite
def scenarios(draw, config_strategy: st.SearchStrategy[HarnessConfig], *,
              max_steps: int = 2, fault_kinds: Sequence[FaultKind] = (),
              fault_every: int = 1, name: str = "fuzz") -> Scenario:
    """A whole scenario: a config, 1..max_steps steps of skewed batches, and maybe a fault
    (always when fault_every is 1, else about one scenario in fault_every)."""
    config = draw(config_strategy)
    drawn = [draw(skewed_batches(config)) for _ in range(draw(st.integers(1, max_steps)))]
    ranks = [tuple(batches) for batches in drawn]  # the drawn inputs, as they are
    planted = ()
    # The fault sits at the top of the draw so that the simplest example has none: Hypothesis
    # starts from and shrinks toward the simplest, and a faulted example costs its timeouts.
    if fault_kinds and draw(st.integers(0, fault_every - 1)) == fault_every - 1:
        threaded = steps_with_microbatch_threads(config, drawn)
        planted = draw(faults(config, len(ranks), fault_kinds, threaded))
    if not planted:  # a fault on a dead rank's silent member would test the stand-in
        ranks = draw(deaths(config, ranks))
    return Scenario(config, tuple(ranks), planted, name=name)
