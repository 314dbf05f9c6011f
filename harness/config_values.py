"""Value rules of the harness configuration that need no HarnessConfig: enum parsing, vLLM's
default capture-size ladder, and the speculative-decoding fields (docs/spec.md §0.3, §1.6)."""

from __future__ import annotations

import enum
import math
import threading
from typing import Any

from harness.errors import ConfigError
from harness.vllm_code.release import Release

# Thread waits and sleeps overflow past threading.TIMEOUT_MAX (about 292 years), and a world
# waits up to 4x a step deadline: no one bound may exceed an eighth of it.
MAX_WAIT_S = threading.TIMEOUT_MAX / 8


def check_seconds(field: str, value: Any, *, zero_ok: bool = False,
                  limit: float | None = MAX_WAIT_S) -> float:
    """A duration in seconds: a finite number, positive (or zero), at most `limit`."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ConfigError(field, f"must be a finite number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not zero_ok):
        kind = "non-negative" if zero_ok else "positive"
        raise ConfigError(field, f"must be {kind}, got {value!r}")
    if limit is not None and value > limit:
        raise ConfigError(field, f"is {value!r}; at most {limit:.0f} s: thread waits overflow "
                          "past threading.TIMEOUT_MAX and a world waits up to 4x a deadline")
    return float(value)


def parse_enum(enum_cls: type[enum.Enum], value: Any, field_name: str) -> enum.Enum:
    if isinstance(value, enum_cls):
        return value
    try:
        return enum_cls(value)
    except ValueError:
        allowed = ", ".join(str(m.value) for m in enum_cls)
        raise ConfigError(field_name, f"unknown value {value!r} (one of {allowed})") from None


def default_capture_sizes(max_num_reqs: int, max_num_batched_tokens: int,
                          decode_query_len: int = 1,
                          decode_sizes_appended: bool = False) -> tuple[int, ...]:
    """vLLM's default capture-size ladder (docs/spec.md §0.3); `decode_sizes_appended`:
    0.34's, which with drafts adds every uniform decode size of its request-count grid."""
    largest = min(max_num_reqs * decode_query_len * 2, 512, max_num_batched_tokens)
    sizes = {s for s in (1, 2, 4) if s <= largest}
    if largest >= 8:
        sizes.update(range(8, min(largest + 1, 256), 8))
    if largest >= 256:
        sizes.update(range(256, largest + 1, 16))
    if max_num_batched_tokens <= largest:
        sizes.add(max_num_batched_tokens)
    if decode_sizes_appended and decode_query_len > 1:
        ceiling = min(max_num_reqs * decode_query_len * 2, 512)
        sizes.update(n * decode_query_len for n in decode_request_counts(max_num_reqs)
                     if n * decode_query_len <= min(ceiling, max_num_batched_tokens))
    return tuple(sorted(sizes))


def decode_request_counts(max_num_reqs: int) -> list[int]:
    """0.34's request-count grid for draft decodes: 1, 2, 4, every 8 below 256, every 16 from
    256, and the largest count itself, all at most min(max_num_reqs, 512)."""
    top = min(max_num_reqs, 512)
    counts = {n for n in (1, 2, 4) if n <= top}
    counts.update(range(8, min(top + 1, 256), 8))
    counts.update(range(256, top + 1, 16))
    counts.add(top)
    return sorted(counts)


def varlen_decode_token_sizes(max_tokens: int) -> list[int]:
    """0.34's token grid of adaptive verification's decode graphs, up to `max_tokens`: 1, 2,
    4, 8, four sizes per doubling up to 1024, every 128 up to 4096, every 256 beyond."""
    grid = {1, 2, 4, 8}
    low = 8
    while low < 1024:
        grid.update(range(low + low // 4, 2 * low + 1, low // 4))
        low *= 2
    grid.update(range(1024, 4096, 128), range(4096, max_tokens, 256))
    return sorted({s for s in grid if s < max_tokens} | {max_tokens}) if max_tokens > 0 else []


def check_spec_decoding(decode_query_len: Any, varlen_decode: Any, use_ubatching: bool,
                        release: Release) -> None:
    """Draft tokens (decode_query_len > 1) with microbatching only from 0.34 on: 0.33's
    VllmConfig._get_dbo_unsupported_features rejects speculative decoding with DBO; varlen
    decode graphs (adaptive verification) exist only with drafts (docs/spec.md §1.6)."""
    if (not isinstance(decode_query_len, int) or isinstance(decode_query_len, bool)
            or decode_query_len < 1):
        raise ConfigError("decode_query_len",
                          f"must be a positive integer, got {decode_query_len!r}")
    if use_ubatching and decode_query_len != 1 and not release.spec_decode_with_dbo:
        raise ConfigError("decode_query_len", f"is {decode_query_len}; vLLM {release.value} "
                          "rejects speculative decoding with DBO (microbatching): use 1, "
                          "or release 0.34")
    if not isinstance(varlen_decode, bool):
        raise ConfigError("varlen_decode", f"must be true or false, got {varlen_decode!r}")
    if varlen_decode and decode_query_len == 1:
        raise ConfigError("varlen_decode", "needs decode_query_len > 1 (varlen decode graphs "
                          "serve speculative decoding's adaptive verification)")


def check_fault_tolerance(fault_tolerance: Any, release: Release, dp_size: int) -> None:
    """Dead DP ranks only where the release's DP sync knows of them (0.34), and only with a
    rank left to survive one (docs/spec.md §1.7)."""
    if not isinstance(fault_tolerance, bool):
        raise ConfigError("fault_tolerance", f"must be true or false, got {fault_tolerance!r}")
    if fault_tolerance and not release.dead_dp_ranks:
        raise ConfigError("fault_tolerance", f"vLLM {release.value}'s DP sync has no dead "
                          "ranks to leave out: use release 0.34")
    if fault_tolerance and dp_size < 2:
        raise ConfigError("fault_tolerance", f"needs dp_size >= 2 (a survivor), not {dp_size}")


def check_draft_schedule(schedule: Any, decode_query_len: int, max_num_reqs: int,
                         release: Release) -> None:
    """Dynamic speculative decoding's (q, most requests) pairs (docs/spec.md §1.6): 0.34 only,
    each q within 1..decode_query_len, each batch size under exactly one q, all of them."""
    if schedule is None:
        return
    name = "draft_schedule"
    if not release.request_keyed_decode:
        raise ConfigError(name, f"is 0.34's dynamic speculative decoding; release is "
                          f"{release.value}")
    for q, most in schedule:
        for value in (q, most):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(name, f"must hold positive integers, got {[q, most]!r}")
        if q > decode_query_len:
            raise ConfigError(name, f"query length {q} exceeds decode_query_len="
                              f"{decode_query_len} (1 + the most drafts)")
    lengths, limits = [q for q, _ in schedule], [most for _, most in schedule]
    if len(set(lengths)) != len(lengths) or len(set(limits)) != len(limits):
        raise ConfigError(name, f"repeats a query length or a request count: {schedule!r}")
    if max(limits) != max_num_reqs:
        raise ConfigError(name, f"must cover every batch size: its largest request count is "
                          f"{max(limits)}, not max_num_reqs={max_num_reqs}")
