"""Tensors of the forward that depend only on shapes (index ranges, filler columns, scalars),
built once per shape: a step, and the replay of a graph captured over it, then issues no op
to rebuild them. Their values are those the ops gave, so every result stays bit-identical."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from harness.model.weights import DTYPE

Build = Callable[[torch.device], torch.Tensor]


class ShapeConstants:
    """Read-only tensors on `device`, keyed by what they hold; shared by the microbatch
    threads (built under a lock, never written after)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._built: dict[tuple, torch.Tensor] = {}
        self._lock = threading.Lock()

    def arange(self, n: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        """0, 1, ..., n - 1."""
        return self._get(("arange", n, dtype), lambda d: torch.arange(n, dtype=dtype, device=d))

    def scalar(self, value: float, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        """`value` as a 0-dim tensor (torch.where with a Python number builds one per call)."""
        return self._get(("scalar", value, dtype),
                         lambda d: torch.tensor(value, dtype=dtype, device=d))

    def column(self, rows: int, value: float) -> torch.Tensor:
        """[rows, 1] of `value`."""
        return self._get(("column", rows, value),
                         lambda d: torch.full((rows, 1), value, dtype=DTYPE, device=d))

    def token_index(self, start: int, num_tokens: int, k: int) -> torch.Tensor:
        """[num_tokens * k, 1]: the step index of each (token, k) pair's token."""
        return self._get(("token_index", start, num_tokens, k), lambda d: torch.arange(
            start, start + num_tokens, dtype=DTYPE, device=d).repeat_interleave(k).unsqueeze(1))

    def _get(self, key: tuple, build: Build) -> torch.Tensor:
        found = self._built.get(key)
        if found is not None:
            return found
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # First needed inside a capture (its warmup builds them before): a temporary of
            # the graph, as any other; the blocking copy below would sync the host.
            return build(self.device)
        # Built on the host, then a blocking copy: on the device for every stream at once.
        tensor = build(torch.device("cpu")).to(self.device)
        with self._lock:
            return self._built.setdefault(key, tensor)
