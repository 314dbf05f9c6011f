"""One op as the emulated graph recorded it, and how to issue it again on the same memory.

Tensors are remembered by where they lived when the op ran (storage, dtype, size, stride,
offset), never as the tensor objects: an in-place op such as `squeeze_` changes a tensor's
size after it was recorded, and replay must see the tensor as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from harness.runtime.arg_tree import ArgSpec, flatten, leaves_of, unflatten
from harness.runtime.comm import CollectiveTimeout

# Ops that only allocate: their contents are undefined, so replay neither runs nor copies them
# (a real graph replay does not touch that memory either).
ALLOCATION_ONLY_OPS = frozenset({
    torch.ops.aten.empty.memory_format,
    torch.ops.aten.empty_strided.default,
    torch.ops.aten.empty_like.default,
    torch.ops.aten.new_empty.default,
    torch.ops.aten.new_empty_strided.default,
})


# In-place ops that change their argument's size, stride or storage rather than its data.
METADATA_MUTATING_OPS = frozenset({
    "squeeze_", "unsqueeze_", "transpose_", "t_", "as_strided_", "resize_", "resize_as_",
    "swapdims_", "swapaxes_", "set_", "detach_",
})


def _nothing() -> None:
    return None


@dataclass(frozen=True, eq=False)
class TensorSlot:
    """Where a tensor lived when an op ran; `view()` rebuilds it on the same storage."""

    storage: torch.UntypedStorage
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorSlot:
        return cls(tensor.untyped_storage(), tensor.dtype, tuple(tensor.shape),
                   tuple(tensor.stride()), tensor.storage_offset())

    def view(self) -> torch.Tensor:
        empty = torch.empty(0, dtype=self.dtype, device=self.storage.device)
        return empty.set_(self.storage, self.offset, self.size, self.stride)

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` lives in this slot's storage (an alias, not a fresh result)."""
        return tensor.untyped_storage().data_ptr() == self.storage.data_ptr()


@dataclass(frozen=True)
class CollectiveCall:
    """A collective's fingerprint: comparable across ranks, hashable, printable."""

    op: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    output_split_sizes: tuple[int, ...] | None = None
    input_split_sizes: tuple[int, ...] | None = None


@dataclass(frozen=True, eq=False)
class RecordedOp:
    """An op issued on a capturing stream: what ran, on what memory, from where."""

    op: torch._ops.OpOverload
    arg_spec: ArgSpec
    arg_leaves: tuple[Any, ...]  # TensorSlot for tensors, the value itself otherwise
    result_leaves: tuple[Any, ...]  # TensorSlot for tensors, None otherwise
    stream: str
    thread: str

    @property
    def name(self) -> str:
        return str(self.op)

    @property
    def is_collective(self) -> bool:
        return self.op.namespace == "c10d"

    def collective(self) -> CollectiveCall | None:
        if not self.is_collective:
            return None
        bound = _bind(self.op, unflatten(self.arg_leaves, self.arg_spec))
        slots = [leaf for leaf in self.arg_leaves if isinstance(leaf, TensorSlot)]

        def splits(name: str) -> tuple[int, ...] | None:
            value = bound.get(name)
            return tuple(value) if value is not None else None

        return CollectiveCall(
            op=self.name,
            shapes=tuple(s.size for s in slots),
            dtypes=tuple(str(s.dtype).removeprefix("torch.") for s in slots),
            output_split_sizes=splits("output_split_sizes"),
            input_split_sizes=splits("input_split_sizes"))

    def replay(self, collective_timeout_s: float | None) -> None:
        """Issue the op again on the recorded memory; fresh results go where they went."""
        self.compile(collective_timeout_s)()

    def compile(self, collective_timeout_s: float | None) -> Callable[[], None]:
        """The replay of this op as a closure over views built once.

        The views are this closure's own tensor objects on the recorded storage, so only an
        op that changes its own argument's metadata in place needs them rebuilt each time.
        """
        if self.op in ALLOCATION_ONLY_OPS:
            return _nothing
        op, spec, leaves = self.op, self.arg_spec, self.arg_leaves

        def build_args():
            return unflatten([leaf.view() if isinstance(leaf, TensorSlot) else leaf
                              for leaf in leaves], spec)

        rebuild = op._opname in METADATA_MUTATING_OPS
        args, kwargs = build_args()
        targets = [slot.view() if isinstance(slot, TensorSlot) else None
                   for slot in self.result_leaves]
        collective = self.is_collective

        def run() -> None:
            nonlocal args, kwargs
            if rebuild:
                args, kwargs = build_args()
            if collective:
                out_leaves = _run_collective(op, args, kwargs, collective_timeout_s)
            else:
                out_leaves = leaves_of(op(*args, **kwargs))
            for leaf, target in zip(out_leaves, targets, strict=True):
                if target is not None and leaf.untyped_storage().data_ptr() != \
                        target.untyped_storage().data_ptr():
                    target.copy_(leaf)

        return run


def record_op(op: torch._ops.OpOverload, arg_slots: tuple[Any, ...], arg_spec: ArgSpec,
              results: Any, stream: str, thread: str) -> RecordedOp:
    """The record of an op that ran; `arg_slots` were taken before it ran (see module doc)."""
    out_leaves = leaves_of(results)
    result_slots = tuple(TensorSlot.of(x) if isinstance(x, torch.Tensor) else None
                         for x in out_leaves)
    return RecordedOp(op, arg_spec, arg_slots, result_slots, stream, thread)


def snapshot_args(args: tuple, kwargs: dict) -> tuple[tuple[Any, ...], ArgSpec]:
    leaves, spec = flatten((args, kwargs))
    return tuple(TensorSlot.of(x) if isinstance(x, torch.Tensor) else x for x in leaves), spec


def _bind(op: torch._ops.OpOverload, args_kwargs: tuple[tuple, dict]) -> dict[str, Any]:
    args, kwargs = args_kwargs
    names = [a.name for a in op._schema.arguments]
    return {**dict(zip(names, args, strict=False)), **kwargs}


def _run_collective(op, args, kwargs, timeout_s: float | None) -> list[Any]:
    """A replayed collective, waited (it writes its outputs asynchronously); a peer that
    never comes or went away fails it as a CollectiveTimeout, as an eager one would."""
    try:
        out_leaves = leaves_of(op(*args, **kwargs))
        for leaf in out_leaves:
            _wait_if_work(leaf, timeout_s)
    except RuntimeError as exc:
        raise CollectiveTimeout(f"replayed {op._opname} failed: "
                                f"{str(exc).splitlines()[0]}") from exc
    return out_leaves


def _wait_if_work(value: Any, timeout_s: float | None) -> None:
    if isinstance(value, torch.ScriptObject):
        # Inside the dispatcher c10d ops hand back Work boxed as a TorchScript object.
        if value._type().name() != "Work":
            return
        value = dist.distributed_c10d.Work.unbox(value)
    if isinstance(value, dist.distributed_c10d.Work):
        if timeout_s is None:
            value.wait()
        else:
            value.wait(timedelta(seconds=timeout_s))
