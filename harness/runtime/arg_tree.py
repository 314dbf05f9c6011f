"""An aten op's arguments and results as flat leaves and a spec to rebuild them.

The emulated graph takes apart every op it records (harness/runtime/op_record.py), thousands
per capture. Aten ops take and return tuples, lists and dicts of tensors and scalars: those
are opened here directly, several times faster than torch's general pytree, which stays the
path for any other container it knows (a torch.Size is kept whole: it is immutable).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import SUPPORTED_NODES, TreeSpec, tree_flatten, tree_unflatten

# A spec is None for a leaf, (tuple|list, children) or (dict, keys, children), or torch's
# TreeSpec for a tree that holds another kind of container.
ArgSpec = Any

_OPENED_BY_TORCH = frozenset(SUPPORTED_NODES) - {tuple, list, dict, torch.Size}


class _OtherContainer(Exception):
    """A container only torch's pytree knows how to open."""


def flatten(tree: Any) -> tuple[list[Any], ArgSpec]:
    """The tree's leaves in torch's pytree order, and the spec that `unflatten` rebuilds it
    from."""
    leaves: list[Any] = []
    try:
        return leaves, _flatten(tree, leaves)
    except _OtherContainer:
        return tree_flatten(tree)


def leaves_of(tree: Any) -> list[Any]:
    """The leaves alone (an op's results, when only their tensors matter)."""
    kind = type(tree)
    if kind is torch.Tensor or tree is None:
        return [tree]
    return flatten(tree)[0]


def unflatten(leaves: list[Any] | tuple[Any, ...], spec: ArgSpec) -> Any:
    if isinstance(spec, TreeSpec):
        return tree_unflatten(list(leaves), spec)
    it = iter(leaves)
    return _rebuild(spec, it)


def _flatten(node: Any, leaves: list[Any]) -> ArgSpec:
    kind = type(node)
    if kind is tuple or kind is list:
        return kind, tuple([_flatten(child, leaves) for child in node])
    if kind is dict:
        return dict, tuple(node), tuple([_flatten(child, leaves) for child in node.values()])
    if kind in _OPENED_BY_TORCH or (isinstance(node, (tuple, list, dict))
                                     and kind is not torch.Size):
        raise _OtherContainer  # a namedtuple, an OrderedDict, a return type ...
    leaves.append(node)
    return None


def _rebuild(spec: ArgSpec, leaves) -> Any:
    if spec is None:
        return next(leaves)
    if spec[0] is dict:
        return {key: _rebuild(child, leaves) for key, child in zip(spec[1], spec[2],
                                                                    strict=True)}
    children = [_rebuild(child, leaves) for child in spec[1]]
    return tuple(children) if spec[0] is tuple else children
