"""Which requests and tokens of a step one microbatch covers.

Its own module, free of torch and of `sut`, so the model reads slices without importing the
slicer that produces them (sut imports model, never the other way round).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UbatchSlice:
    req_start: int
    req_stop: int
    tok_start: int
    tok_stop: int

    @property
    def num_tokens(self) -> int:
        return self.tok_stop - self.tok_start

    def is_empty(self) -> bool:
        return self.req_stop <= self.req_start or self.tok_stop <= self.tok_start
