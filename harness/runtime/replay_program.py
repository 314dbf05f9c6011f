"""A recorded trace compiled once into a flat replay program: one tuple per op that does work.

Per op, everything that does not change between replays is settled at compile time: the
argument views on the recorded storage, whether the result is fresh (computed straight into
where it went at capture through the op's out= overload, or by copy_ for a dtype or device
conversion, else copied there) or aliases an argument (written in place, nothing to copy), and
which ops do no work at all. An op that only views its argument (view, slice, unsqueeze, ...)
is left out: every later op rebuilds its tensors from the recorded storage, size, stride and
offset, so such a view's result is never read. Replay still reads the captured buffers'
current contents: nothing that holds data is snapshotted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

import torch

from harness.runtime.arg_tree import unflatten
from harness.runtime.op_record import (
    ALLOCATION_ONLY_OPS,
    METADATA_MUTATING_OPS,
    RecordedOp,
    TensorSlot,
)

_TO_COPY = torch.ops.aten._to_copy.default
_COPY = torch.ops.aten.copy_.default

# (callable, args, kwargs, copy target): None (nothing to copy), a tensor (the single fresh
# result goes there) or a tuple of tensors or None (one per result).
Step = tuple[Callable[..., Any], tuple, dict, Any]


def _writes_an_argument(op: torch._ops.OpOverload) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write
               for a in op._schema.arguments)


def _arg_storages(recorded: RecordedOp) -> set[int]:
    return {leaf.storage.data_ptr() for leaf in recorded.arg_leaves
            if isinstance(leaf, TensorSlot)}


def _aliases(slot: Any, storages: set[int]) -> bool:
    return isinstance(slot, TensorSlot) and slot.storage.data_ptr() in storages


def _flat_tensor_returns(op: torch._ops.OpOverload) -> int | None:
    """How many Tensor results the op returns as a flat tuple (1: a bare tensor); None for
    anything else (lists, optionals, scalars)."""
    returns = op._schema.returns
    if returns and all(str(r.type) == "Tensor" for r in returns):
        return len(returns)
    return None


@cache
def out_variant(op: torch._ops.OpOverload) -> tuple[torch._ops.OpOverload, str] | None:
    """The overload that writes `op`'s one result into a given tensor, with exactly `op`'s
    arguments besides (e.g. add.Tensor -> add.out); None where there is none."""
    want = [(a.name, str(a.type)) for a in op._schema.arguments]
    for name in op.overloadpacket.overloads():
        other = getattr(op.overloadpacket, name)
        arguments = other._schema.arguments
        writes = [a for a in arguments if a.alias_info is not None and a.alias_info.is_write]
        if other is op or len(writes) != 1 or not writes[0].kwarg_only:
            continue
        if [(a.name, str(a.type)) for a in arguments if a is not writes[0]] == want:
            return other, writes[0].name
    return None


def is_pure_view(recorded: RecordedOp) -> bool:
    """An op that writes nothing and whose every result lives in an argument's storage: its
    replay would only build a view nobody reads (later ops rebuild theirs from slots)."""
    if recorded.is_collective or _writes_an_argument(recorded.op):
        return False
    results = recorded.result_leaves
    storages = _arg_storages(recorded)
    return bool(results) and all(_aliases(slot, storages) for slot in results)


def compile_op(recorded: RecordedOp, collective_timeout_s: float | None) -> Step | None:
    """The op's replay step, or None when its replay does nothing."""
    op = recorded.op
    if op in ALLOCATION_ONLY_OPS or is_pure_view(recorded):
        return None
    count = _flat_tensor_returns(op)
    if (recorded.is_collective or op._opname in METADATA_MUTATING_OPS or count is None
            or count != len(recorded.result_leaves)):
        # Waited collectives, ops that rebuild their arguments, odd result shapes: the
        # general per-op replay.
        return recorded.compile(collective_timeout_s), (), {}, None
    args, kwargs = unflatten([leaf.view() if isinstance(leaf, TensorSlot) else leaf
                              for leaf in recorded.arg_leaves], recorded.arg_spec)
    storages = _arg_storages(recorded)
    # Whether a result aliased an argument is a property of the op on these shapes: as at
    # capture, an in-place result is left where it is and a fresh one is copied back.
    targets = tuple(None if _aliases(slot, storages) else slot.view()
                    for slot in recorded.result_leaves)
    if count == 1 and targets[0] is not None and op is _TO_COPY:
        # A dtype or device conversion: converted straight into where its result went at
        # capture (_to_copy is an empty tensor plus copy_), no temporary and no second copy.
        return (_entry(_COPY), (targets[0], args[0]),
                {"non_blocking": kwargs.get("non_blocking", False)}, None)
    if count == 1 and targets[0] is not None and (out := out_variant(op)) is not None:
        # A fresh result computed straight into where it went at capture: no copy.
        variant, name = out
        return _entry(variant), tuple(args), {**kwargs, name: targets[0]}, None
    if count == 1:
        return _entry(op), tuple(args), kwargs, targets[0]
    return _entry(op), tuple(args), kwargs, (targets if any(t is not None for t in targets)
                                       else None)


def _entry(op: torch._ops.OpOverload) -> Callable[..., Any]:
    return getattr(op, "_op", op)  # the overload's own entry, one Python frame fewer


def compile_trace(ops: Sequence[RecordedOp],
                  collective_timeout_s: float | None) -> tuple[Step, ...]:
    steps = (compile_op(op, collective_timeout_s) for op in ops)
    return tuple(step for step in steps if step is not None)


def run_program(steps: tuple[Step, ...]) -> None:
    """Issue every step in order on the recorded memory (call under no_grad)."""
    for call, args, kwargs, target in steps:
        out = call(*args, **kwargs)
        if target is None:
            continue
        if type(target) is tuple:
            for each, value in zip(target, out, strict=True):
                if each is not None:
                    each.copy_(value)
        else:
            target.copy_(out)
