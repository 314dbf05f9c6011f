"""What one rank brings to a step: its scheduled batch, summarised as the DP sync sees it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.config import HarnessConfig
from harness.errors import ConfigError


@dataclass(frozen=True)
class RankBatch:
    """One rank's batch. `query_lens` (per request) is the full batch; the rest summarise it.

    `uniform_token_count` is the per-request query length when every request has the same
    one and no request is a prefill (vLLM's get_uniform_decode_token_count); None otherwise.
    A request longer than `decode_query_len` (1 + draft tokens) is a prefill (§1.6).
    `allow_skip_drafts`: the rank's scheduler finds none of its requests can use this step's
    drafts (the skip_drafts row of vLLM's DP sync).
    """

    num_tokens: int
    num_reqs: int
    uniform_token_count: int | None
    allow_ubatching: bool = True
    query_lens: tuple[int, ...] | None = None
    decode_query_len: int = 1
    allow_skip_drafts: bool = False

    @classmethod
    def from_query_lens(cls, query_lens: Sequence[int], allow_ubatching: bool = True,
                        decode_query_len: int = 1, allow_skip_drafts: bool = False) -> RankBatch:
        lens = tuple(query_lens)
        uniform = bool(lens) and all(q == lens[0] for q in lens) and lens[0] <= decode_query_len
        return cls(sum(lens), len(lens), lens[0] if uniform else None, allow_ubatching, lens,
                   decode_query_len, allow_skip_drafts)

    @classmethod
    def uniform(cls, num_tokens: int, uniform_token_count: int | None = 1,
                num_reqs: int | None = None, allow_ubatching: bool = True) -> RankBatch:
        """A batch given by counts; requests default to tokens / uct (or one per token)."""
        if num_tokens == 0:
            return cls(0, 0, None, allow_ubatching, ())
        if num_reqs is None:
            num_reqs = num_tokens // uniform_token_count if uniform_token_count else num_tokens
        return cls(num_tokens, num_reqs, uniform_token_count, allow_ubatching)

    @property
    def max_query_len(self) -> int | None:
        """The rank's query-length bound: its longest request, None with a prefill (vLLM's
        runner leaves such a batch out of varlen decode graphs, docs/spec.md §1.6)."""
        if self.query_lens is not None:
            longest = max(self.query_lens, default=0)
            return None if longest > self.decode_query_len else longest
        return self.uniform_token_count

    def request_query_lens(self) -> tuple[int, ...]:
        """Per-request query lengths; a batch given by counts spreads tokens like a dummy batch."""
        if self.query_lens is not None:
            return self.query_lens
        return dummy_query_lens(self.num_reqs, self.num_tokens)


def deciding_batch(batch: RankBatch, decode_query_len: int) -> RankBatch:
    """What a rank brings to the DP sync: its batch, or for an idle rank vLLM's dummy batch
    (execute_dummy_batch: one uniform-decode request of decode_query_len tokens, all padding),
    which votes and allows microbatching like a busy rank's (docs/spec.md §1.1)."""
    if batch.num_tokens:
        return batch
    q = decode_query_len
    return RankBatch(q, 1, q, batch.allow_ubatching, (q,), q, batch.allow_skip_drafts)


def dummy_query_lens(num_reqs: int, num_tokens: int) -> tuple[int, ...]:
    """vLLM's make_dummy layout: tokens // reqs each, the last tokens % reqs get one more."""
    if num_reqs == 0:
        return ()
    base, extra = divmod(num_tokens, num_reqs)
    return tuple(base + (1 if i >= num_reqs - extra else 0) for i in range(num_reqs))


def validate_batches(config: HarnessConfig, batches: Sequence[RankBatch]) -> None:
    """Reject per-rank batches that no scheduler would hand the ranks under this config."""
    if len(batches) != config.dp_size:
        raise ConfigError("tokens", f"has {len(batches)} entries for dp_size={config.dp_size}")
    for rank, batch in enumerate(batches):
        where = f"rank {rank}"
        if batch.num_tokens < 0:
            raise ConfigError("tokens", f"{where} has a negative token count {batch.num_tokens}")
        if batch.num_reqs < 0:
            raise ConfigError("reqs", f"{where} has a negative request count {batch.num_reqs}")
        if batch.num_tokens > config.max_num_batched_tokens:
            raise ConfigError("tokens", f"{where} schedules {batch.num_tokens} tokens, above "
                              f"max_num_batched_tokens={config.max_num_batched_tokens}")
        if batch.num_reqs > config.max_num_reqs:
            raise ConfigError("reqs", f"{where} schedules {batch.num_reqs} requests, above "
                              f"max_num_reqs={config.max_num_reqs}")
        if (batch.num_tokens == 0) != (batch.num_reqs == 0):
            raise ConfigError("reqs", f"{where} has {batch.num_tokens} tokens in "
                              f"{batch.num_reqs} requests")
        if batch.num_reqs > batch.num_tokens:
            raise ConfigError("reqs", f"{where} has more requests ({batch.num_reqs}) than "
                              f"tokens ({batch.num_tokens})")
        uct = batch.uniform_token_count
        if uct is not None and (uct < 1 or uct * batch.num_reqs != batch.num_tokens):
            raise ConfigError("uct", f"{where} claims {uct} tokens per request but has "
                              f"{batch.num_tokens} tokens in {batch.num_reqs} requests")
        lens = batch.query_lens
        if lens is not None and any(q < 1 for q in lens):
            raise ConfigError("query_lens", f"{where} has a request with no tokens")
        if lens is not None and (len(lens) != batch.num_reqs or sum(lens) != batch.num_tokens):
            raise ConfigError("query_lens", f"{where} lists {len(lens)} requests of {sum(lens)} "
                              f"tokens, not {batch.num_reqs} of {batch.num_tokens}")
