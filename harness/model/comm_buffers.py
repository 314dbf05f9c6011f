"""The layout of the dispatch/combine all-to-alls: fixed-size per-peer blocks whose rows carry
the hidden vector plus provenance columns, so a receiver can say where each row came from."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.model.weights import DTYPE

# Payload columns after the hidden vector: source rank, token index in its rank's step, expert.
SRC_COL, TOK_COL, EXPERT_COL = 0, 1, 2
NUM_PROVENANCE_COLS = 3
# A block's count row holds the count in column 0 and the run's readiness tag here.
TAG_COL = 1


class DispatchOverflow(RuntimeError):
    """A microbatch holds more tokens than the all-to-all buffers take per rank (DeepEP's
    low-latency dispatch refuses such a batch on the host, before any transfer)."""


@dataclass(frozen=True)
class CommBuffers:
    """Fixed-size dispatch/combine buffers of one microbatch: every peer block holds a count
    row and `capacity` payload rows; the send and combine-receive buffers have a trailing
    dump row where non-routed (token, k) pairs go."""

    peers: int
    capacity: int
    dispatch_send: torch.Tensor  # [P*(C+1) + 1, W]
    dispatch_recv: torch.Tensor  # [P*(C+1), W]
    combine_send: torch.Tensor  # [P*(C+1), W]
    combine_recv: torch.Tensor  # [P*(C+1) + 1, W]

    @classmethod
    def allocate(cls, peers: int, capacity: int, width: int,
                 device: torch.device | str = "cpu") -> CommBuffers:
        rows = peers * (capacity + 1)

        def zeros(n: int) -> torch.Tensor:
            return torch.zeros(n, width, dtype=DTYPE, device=device)

        return cls(peers, capacity, zeros(rows + 1), zeros(rows), zeros(rows), zeros(rows + 1))

    @property
    def rows(self) -> int:
        return self.peers * (self.capacity + 1)


@dataclass(frozen=True)
class DispatchHandle:
    flat_index: torch.Tensor  # [T*K]: row of each (token, k) pair in the send buffer
    buffers: CommBuffers
