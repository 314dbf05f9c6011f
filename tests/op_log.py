"""A dispatch mode that lists the aten ops run under it (thread-local, as every dispatch mode
is): for tests that count what a forward issues."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class OpLog(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))
