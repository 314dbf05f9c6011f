"""The draws of draft tokens (docs/spec.md §1.6): their config fields, each rank's layout of
its tokens, and the step shape in which the synced query-length bound picks the graph.

A slip in that bound shows only on a varlen decode graph beside a padded mixed step, with a
decode rank next to a prefill (§7.17): a narrow corner, so the draws lean toward it.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from harness.batch import dummy_query_lens
from harness.config import HarnessConfig
from harness.spec.decision import cut_length, graph_table, last_region_start

DRAFT_LAYOUTS = ("varlen", "uniform", "prefill")
DECODE_LAYOUTS = ("varlen", "uniform")


def draft_fields(draw, pick, drafting: bool = False, rarely: bool = False) -> dict[str, Any]:
    """Speculative decoding's fields: 1 + up to 3 draft tokens per decode request (at least
    one when `drafting`, a config drawn for its drafts; in one config of four when `rarely`,
    microbatched configs, whose other bugs need none), and with drafts three configs in four
    varlen decode graphs (adaptive verification), the graphs the query-length bound chooses
    between; shrunk, the simplest config has none."""
    lengths = st.integers(2 if drafting else 1, 4)
    if rarely and not drafting:
        # One in four, not eight: drafts in split steps (request cuts, trims of adaptive
        # verification) exist only here on 0.34, and one in eight left searches without any.
        lengths = st.integers(0, 3).flatmap(lambda r: st.integers(2, 4) if r == 3 else st.just(1))
    q = pick("decode_query_len", lengths)
    varlen = pick("varlen_decode", st.integers(0, 3).map(bool) if q > 1 else st.just(False))
    return {"decode_query_len": q, "varlen_decode": varlen}


def draft_layout(config: HarnessConfig, n: int, layout: str, draw) -> tuple[int, ...]:
    """`n` tokens as requests of one layout; a layout the limits do not allow falls back to
    the next (uniform to varlen to prefill), and a prefill needs more than q tokens."""
    q, limit = config.serving.decode_query_len, config.serving.max_num_reqs
    if n == 0:
        return ()
    if layout.startswith("uniform-"):  # uniform decodes of one given length
        length = int(layout.removeprefix("uniform-"))
        if 1 <= n // length <= limit:
            return (length,) * (n // length)
        layout = "uniform"
    if layout == "uniform" and (scheduled := scheduled_uniform(config, n)):
        return scheduled  # the rest of the count is dropped: a uniform step is whole
    if layout in ("uniform", "varlen") and -(-n // q) <= limit:
        reqs = draw(st.integers(-(-n // q), min(n, limit)))
        return dummy_query_lens(reqs, n)  # tokens // reqs each, the rest one more: 1..q
    if n > q:
        reqs = draw(st.integers(1, min(n - q, limit)))
        return (n - reqs + 1,) + (1,) * (reqs - 1)  # one prefill chunk longer than q
    return (1,) * min(n, limit)


def scheduled_uniform(config: HarnessConfig, n: int) -> tuple[int, ...]:
    """The most of `n` tokens a uniform decode holds at the query length the draft schedule
    gives its batch size (§1.6); () where none fits."""
    lowest = 1
    for q, most in config.decode_query_lens:
        if lowest <= n // q <= most:
            return (q,) * (n // q)
        lowest = most + 1
    return ()


def draft_schedules(q: int, max_reqs: int) -> st.SearchStrategy:
    """Dynamic speculative decoding (0.34) in one draw of three: batches of up to some count
    draft the most (q), larger ones fewer; shrunk, none."""
    if q < 2 or max_reqs < 2:
        return st.just(None)
    dynamic = st.tuples(st.integers(1, max_reqs - 1), st.integers(1, q - 1)).map(
        lambda drawn: ((q, drawn[0]), (drawn[1], max_reqs)))
    return st.integers(0, 2).flatmap(lambda r: dynamic if r == 2 else st.just(None))


@st.composite
def decode_beside_prefill(draw, config: HarnessConfig) -> list[tuple[int, str]]:
    """Per rank a token count and a layout: a prefill on some ranks, decodes of 1..q tokens
    on the others, every rank within the tokens of one varlen decode graph wider than a
    decode (the config's release says which: §1.6, §2.6). There the synced bound is none and
    must keep the decode ranks out of the varlen graph. Empty where the config leaves none."""
    q, dp = config.serving.decode_query_len, config.serving.dp_size
    sizes = sorted({d.num_tokens for d in graph_table(config)
                    if d.max_query_len is not None and d.num_tokens > q})
    if dp < 2 or q < 2 or not sizes:
        return []
    top = draw(st.sampled_from(sizes))
    prefills = draw(st.sets(st.integers(0, dp - 1), min_size=1, max_size=dp - 1))
    return [(draw(st.integers(q + 1, top)), "prefill") if rank in prefills
            else (draw(st.integers(1, top)), draw(st.sampled_from(DECODE_LAYOUTS)))
            for rank in range(dp)]


@st.composite
def uniform_beside_twin(draw, config: HarnessConfig) -> list[tuple[int, str]]:
    """Per rank uniform decodes of q tokens (a length of the draft schedule), every rank
    within one microbatched twin of n x q tokens and one rank on (or a request either side
    of) the start of its last region, where the guard decides: from 0.34 the split cuts
    between requests (§4.1), so that start is not G/k's. Empty where the config captures no
    such twin."""
    k, lengths = config.num_ubatches, dict(config.decode_query_lens)
    twins = [d for d in graph_table(config)
             if d.num_ubatches > 1 and (d.uniform_token_count or 0) > 1
             and d.uniform_token_count in lengths]
    if config.serving.decode_query_len < 2 or not twins:
        return []
    twin = draw(st.sampled_from(twins))
    q = twin.uniform_token_count
    start = last_region_start(twin.num_tokens, k, cut_length(config, q))
    light = max(0, start + q * draw(st.sampled_from((0, -1, 1))))
    counts = [draw(st.integers(-(-start // q), twin.num_tokens // q)) * q
              for _ in range(config.serving.dp_size)]
    counts[draw(st.integers(0, len(counts) - 1))] = min(light, twin.num_tokens)
    return [(n, f"uniform-{q}") for n in counts]


@st.composite
def drafts_past_the_split(draw, config: HarnessConfig) -> list[tuple[int, str]]:
    """Per rank a token count past the threshold a step that is not a uniform decode must pass
    to be split (the prefill one, §1.2), and any layout: drafts in a step split k ways, where
    the cut between requests (§4.1) and adaptive verification's trims (§7.24) decide which
    requests each microbatch holds. Empty where the config does not microbatch."""
    low, top = max(config.serving.prefill_threshold, 2), config.serving.max_num_batched_tokens
    if config.num_ubatches < 2 or low > top:
        return []
    return [(draw(st.integers(low, top)), draw(st.sampled_from(DRAFT_LAYOUTS)))
            for _ in range(config.serving.dp_size)]
