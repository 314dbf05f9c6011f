"""Scheduled requests and the per-request state cache ("KV-like") a step reads and updates."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.config import HarnessConfig
from harness.model.weights import DTYPE


@dataclass(frozen=True)
class RequestSpec:
    """One scheduled request: its state-cache slot, tokens already cached, new token ids."""

    slot: int
    context_len: int
    token_ids: tuple[int, ...]

    @property
    def query_len(self) -> int:
        return len(self.token_ids)

    @property
    def seq_len(self) -> int:
        return self.context_len + self.query_len

    def positions(self) -> range:
        return range(self.context_len, self.seq_len)


class StateCache:
    """The per-request state ("KV-like"): row `slot`; row `num_slots` is a scratch slot that
    padded requests and non-real tokens are mapped to, so they never touch a real row."""

    def __init__(self, num_slots: int, hidden_size: int,
                 device: torch.device | str = "cpu") -> None:
        self.num_slots = num_slots
        self.state = torch.zeros(num_slots + 1, hidden_size, dtype=DTYPE, device=device)

    @property
    def scratch_slot(self) -> int:
        return self.num_slots


def initial_state(config: HarnessConfig, rank: int) -> torch.Tensor:
    """The state cache a rank starts from: seeded, non-zero (so a lost update shows), with a
    zero scratch row; the reference starts from the same."""
    gen = torch.Generator().manual_seed(config.model.seed * 1009 + rank + 1)
    state = torch.randn(config.serving.max_num_reqs + 1, config.model.hidden_size, generator=gen,
                        dtype=DTYPE)
    state[config.serving.max_num_reqs] = 0.0
    return state
