"""What one rank is given in one step (its scheduled batch, summarised as the DP sync sees
it) and its one wire form, the `ranks` entries of scenario files, worlds and saved histories:

    {"query_lens": [1, 3]}  or  {"tokens": 64}  (that many one-token requests; 0: idle),
    with "allow_ubatching": false and "allow_skip_drafts": true only when not the default, and
    "scheduled_lens": [1, 4] where adaptive verification trimmed drafts (docs/spec.md §1.6),
    and under fault tolerance (§1.7) "knows_dead": [2] (the dead ranks this rank has been told
    of) or "dead": true (the rank has died: it stays idle, a silent member of the rings).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from harness.config import HarnessConfig
from harness.errors import ConfigError


@dataclass(frozen=True)
class RankBatch:
    """One rank's input to one step, built once where a scenario is parsed or an example drawn
    and carried as is through the worlds and the reference. `query_lens` (per request) is
    the full batch; the rest summarise it. A batch given by counts alone (`uniform`, the
    command line's flags) has no `query_lens`.

    `uniform_token_count` is the per-request query length when every request has the same
    one and no request is a prefill (vLLM's get_uniform_decode_token_count); None otherwise.
    A request longer than `decode_query_len` (1 + draft tokens) is a prefill (§1.6).
    `allow_skip_drafts`: the rank's scheduler finds none of its requests can use this step's
    drafts (the skip_drafts row of vLLM's DP sync). `scheduled_lens`: under adaptive
    verification, each request's tokens before its drafts were trimmed to the step's budget
    (vLLM's InputBatch.num_scheduled_tokens, an upper bound); `query_lens` are the tokens
    that run, as the device lays them out. None: nothing was trimmed.
    `knows_dead`: the dead DP ranks this rank has been told of by this step; `dead`: the rank
    itself has died (idle; its `knows_dead` is what the live ranks know together, §1.7).
    """

    num_tokens: int
    num_reqs: int
    uniform_token_count: int | None
    allow_ubatching: bool = True
    query_lens: tuple[int, ...] | None = None
    decode_query_len: int = 1
    allow_skip_drafts: bool = False
    scheduled_lens: tuple[int, ...] | None = None
    knows_dead: tuple[int, ...] = ()
    dead: bool = False

    @classmethod
    def from_query_lens(cls, query_lens: Sequence[int], allow_ubatching: bool = True,
                        decode_query_len: int = 1, allow_skip_drafts: bool = False,
                        scheduled_lens: Sequence[int] | None = None,
                        knows_dead: Sequence[int] = (), dead: bool = False) -> RankBatch:
        lens = tuple(query_lens)
        uniform = bool(lens) and all(q == lens[0] for q in lens) and lens[0] <= decode_query_len
        scheduled = None if scheduled_lens is None else tuple(scheduled_lens)
        return cls(sum(lens), len(lens), lens[0] if uniform else None, allow_ubatching, lens,
                   decode_query_len, allow_skip_drafts, scheduled, tuple(sorted(knows_dead)),
                   dead)

    def with_deaths(self, knows_dead: Sequence[int], dead: bool = False) -> RankBatch:
        """This batch with what the rank knows of dead ranks, and whether it is one (§1.7)."""
        return replace(self, knows_dead=tuple(sorted(knows_dead)), dead=dead)

    def host_lens(self) -> tuple[int, ...]:
        """The host's query lengths under adaptive verification (vLLM's compact_batch): the
        step's draft budget spread evenly over the verification requests, which lead the
        batch, the first ones one more; the device runs `query_lens` (§1.6)."""
        lens = self.request_query_lens()
        if self.scheduled_lens is None:
            return lens
        drafts = [s - 1 if 1 < s <= self.decode_query_len else 0 for s in self.scheduled_lens]
        budget = sum(lens) - sum(s - d for s, d in zip(self.scheduled_lens, drafts, strict=True))
        verifying = sum(1 for d in drafts if d > 0)
        host = [s - d for s, d in zip(self.scheduled_lens, drafts, strict=True)]
        for r in range(verifying):
            host[r] += budget // verifying + (1 if r < budget % verifying else 0)
        return tuple(host)

    def slicing_lens(self) -> tuple[int, ...]:
        """What vLLM 0.34's create_ubatch_slices counts requests by: the scheduled upper
        bound under adaptive verification, else the query lengths."""
        return self.scheduled_lens or self.request_query_lens()

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

    def to_dict(self) -> dict[str, Any]:
        """The wire form (the module docstring); `from_dict` reads it back."""
        lens = self.request_query_lens()
        data: dict[str, Any] = ({"tokens": len(lens)} if all(q == 1 for q in lens)
                                and self.scheduled_lens is None
                                else {"query_lens": list(lens)})
        if not self.allow_ubatching:
            data["allow_ubatching"] = False
        if self.allow_skip_drafts:  # omitted when default: older files read the same
            data["allow_skip_drafts"] = True
        if self.scheduled_lens is not None:
            data["scheduled_lens"] = list(self.scheduled_lens)
        if self.dead:  # a dead rank's knowledge is the live ranks' (§1.7): not written
            data["dead"] = True
        elif self.knows_dead:
            data["knows_dead"] = list(self.knows_dead)
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str = "rank", decode_query_len: int = 1,
                  max_tokens: int | None = None) -> RankBatch:
        """The rank `to_dict` gave (a bare integer is a `tokens` count); a field that does
        not fit raises ConfigError naming it."""
        return cls.from_fields(rank_fields(data, where), decode_query_len, max_tokens)

    @classmethod
    def from_fields(cls, fields: RankFields, decode_query_len: int = 1,
                    max_tokens: int | None = None) -> RankBatch:
        """The rank of checked wire fields. A `tokens` count above `max_tokens` stays a count
        (not expanded into requests), for validate_batches to refuse."""
        spec, allow, skip, scheduled, knows_dead, dead = fields
        if isinstance(spec, int):
            if max_tokens is not None and spec > max_tokens:
                return cls(spec, spec, 1, allow, None, decode_query_len, skip, None,
                           knows_dead, dead)
            spec = (1,) * spec
        return cls.from_query_lens(spec, allow, decode_query_len, skip, scheduled, knows_dead,
                                   dead)

    def given_to(self, decode_query_len: int) -> RankBatch:
        """This rank's input under a config of `decode_query_len` (itself when it is already)."""
        if self.decode_query_len == decode_query_len and self.query_lens is not None:
            return self
        return RankBatch.from_query_lens(self.request_query_lens(), self.allow_ubatching,
                                         decode_query_len, self.allow_skip_drafts,
                                         self.scheduled_lens, self.knows_dead, self.dead)


# A rank's wire fields, checked: its `tokens` count or its `query_lens`; allow_ubatching,
# allow_skip_drafts, scheduled_lens (None when absent), knows_dead and dead.
RankFields = tuple[int | tuple[int, ...], bool, bool, tuple[int, ...] | None, tuple[int, ...],
                   bool]


def _int(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(where, f"must be an integer, got {value!r}")
    return value


def _flag(data: dict, key: str, default: bool, where: str) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key}", f"must be true or false, got {value!r}")
    return value


def rank_fields(data: Any, where: str) -> RankFields:
    """The wire form's fields, each checked on its own (limits need the config: see
    validate_batches)."""
    if isinstance(data, int) and not isinstance(data, bool):
        data = {"tokens": data}
    if not isinstance(data, dict):
        raise ConfigError(where, "must be an object with `tokens` or `query_lens`")
    unknown = set(data) - {"tokens", "query_lens", "allow_ubatching", "allow_skip_drafts",
                           "scheduled_lens", "knows_dead", "dead"}
    if unknown:
        raise ConfigError(f"{where}.{sorted(unknown)[0]}", "is not a rank field")
    if ("tokens" in data) == ("query_lens" in data):
        raise ConfigError(where, "needs exactly one of `tokens` or `query_lens`")
    if "tokens" in data:
        n = _int(data["tokens"], f"{where}.tokens")
        if n < 0:
            raise ConfigError(f"{where}.tokens", f"is negative ({n})")
        spec: int | tuple[int, ...] = n
    else:
        raw = data["query_lens"]
        if not isinstance(raw, list):
            raise ConfigError(f"{where}.query_lens", "must be a list of integers")
        spec = tuple(_int(q, f"{where}.query_lens") for q in raw)
        if any(q < 1 for q in spec):
            raise ConfigError(f"{where}.query_lens", "holds a request with no tokens")
    allow = _flag(data, "allow_ubatching", True, where)
    return (spec, allow, _flag(data, "allow_skip_drafts", False, where), _scheduled(data, where),
            _knows_dead(data, where), _flag(data, "dead", False, where))


def _knows_dead(data: dict, where: str) -> tuple[int, ...]:
    raw = data.get("knows_dead", [])
    if not isinstance(raw, list):
        raise ConfigError(f"{where}.knows_dead", "must be a list of DP ranks")
    ranks = tuple(_int(r, f"{where}.knows_dead") for r in raw)
    if len(set(ranks)) != len(ranks):
        raise ConfigError(f"{where}.knows_dead", f"lists a rank twice: {list(ranks)}")
    return ranks


def _scheduled(data: dict, where: str) -> tuple[int, ...] | None:
    if "scheduled_lens" not in data:
        return None
    raw = data["scheduled_lens"]
    if "query_lens" not in data or not isinstance(raw, list):
        raise ConfigError(f"{where}.scheduled_lens", "must be a list of integers beside "
                          "`query_lens`")
    return tuple(_int(q, f"{where}.scheduled_lens") for q in raw)


def deciding_batch(batch: RankBatch, decode_query_len: int) -> RankBatch:
    """What a rank brings to the DP sync: its batch, or for an idle rank vLLM's dummy batch
    (execute_dummy_batch: one uniform-decode request of decode_query_len tokens, all padding),
    which votes and allows microbatching like a busy rank's (docs/spec.md §1.1)."""
    if batch.num_tokens:
        return batch
    q = decode_query_len
    return RankBatch(q, 1, q, batch.allow_ubatching, (q,), q, batch.allow_skip_drafts,
                     knows_dead=batch.knows_dead, dead=batch.dead)


def dummy_query_lens(num_reqs: int, num_tokens: int) -> tuple[int, ...]:
    """vLLM's make_dummy layout: tokens // reqs each, the last tokens % reqs get one more."""
    if num_reqs == 0:
        return ()
    base, extra = divmod(num_tokens, num_reqs)
    return tuple(base + (1 if i >= num_reqs - extra else 0) for i in range(num_reqs))


def validate_batches(config: HarnessConfig, batches: Sequence[RankBatch]) -> None:
    """Reject per-rank batches that no scheduler would hand the ranks under this config."""
    if len(batches) != config.serving.dp_size:
        raise ConfigError("tokens", f"has {len(batches)} entries for "
                          f"dp_size={config.serving.dp_size}")
    for rank, batch in enumerate(batches):
        where = f"rank {rank}"
        if batch.num_tokens < 0:
            raise ConfigError("tokens", f"{where} has a negative token count {batch.num_tokens}")
        if batch.num_reqs < 0:
            raise ConfigError("reqs", f"{where} has a negative request count {batch.num_reqs}")
        if batch.num_tokens > config.serving.max_num_batched_tokens:
            raise ConfigError("tokens", f"{where} schedules {batch.num_tokens} tokens, above "
                              f"max_num_batched_tokens={config.serving.max_num_batched_tokens}")
        if batch.num_reqs > config.serving.max_num_reqs:
            raise ConfigError("reqs", f"{where} schedules {batch.num_reqs} requests, above "
                              f"max_num_reqs={config.serving.max_num_reqs}")
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
        check_scheduled_lens(config, batch, where)
        lens = batch.query_lens
        if lens is not None and any(q < 1 for q in lens):
            raise ConfigError("query_lens", f"{where} has a request with no tokens")
        if lens is not None and (len(lens) != batch.num_reqs or sum(lens) != batch.num_tokens):
            raise ConfigError("query_lens", f"{where} lists {len(lens)} requests of {sum(lens)} "
                              f"tokens, not {batch.num_reqs} of {batch.num_tokens}")


def check_scheduled_lens(config: HarnessConfig, batch: RankBatch, where: str) -> None:
    """Trimmed drafts only under adaptive verification, and only off a decode's drafts: each
    request runs at least one token and at most what was scheduled (§1.6)."""
    scheduled, lens = batch.scheduled_lens, batch.query_lens
    if scheduled is None or lens is None:
        return
    if not config.serving.varlen_decode:
        raise ConfigError("scheduled_lens", f"{where}: drafts are trimmed only by adaptive "
                          "verification (varlen_decode)")
    if len(scheduled) != len(lens):
        raise ConfigError("scheduled_lens", f"{where} lists {len(scheduled)} requests, "
                          f"query_lens {len(lens)}")
    q = config.serving.decode_query_len
    for r, (ran, planned) in enumerate(zip(lens, scheduled, strict=True)):
        if ran > planned or (ran < planned and planned > q):
            raise ConfigError("scheduled_lens", f"{where} request {r}: {ran} tokens run of "
                              f"{planned} scheduled; only a decode's drafts (<= {q}) are trimmed")
