"""The emulated graph's own flattening of an op's arguments: the same leaves, in the same
order, as torch's pytree, and the same tree rebuilt, for every tree an aten op takes;
containers only torch's pytree opens go through it."""

from __future__ import annotations

from collections import OrderedDict, namedtuple

import hypothesis.strategies as st
import torch
from hypothesis import given
from torch.utils._pytree import TreeSpec, tree_flatten

from harness.runtime.arg_tree import flatten, leaves_of, unflatten

TENSOR = torch.arange(3.0)
Pair = namedtuple("Pair", "a b")

leaf = st.one_of(st.integers(-3, 3), st.floats(allow_nan=False), st.booleans(), st.none(),
                 st.just(TENSOR), st.just(torch.float16), st.just("mean"))
trees = st.recursive(leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple),
    st.dictionaries(st.sampled_from("xyz"), inner, max_size=3)), max_leaves=12)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    if type(a) is not type(b):
        return False
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


@given(trees)
def test_leaves_come_in_torchs_order_and_the_tree_is_rebuilt_as_it_was(tree):
    leaves, spec = flatten(tree)
    assert [id(x) for x in leaves] == [id(x) for x in tree_flatten(tree)[0]]
    assert _same(unflatten(leaves, spec), tree)
    assert [id(x) for x in leaves_of(tree)] == [id(x) for x in leaves]


def test_new_leaves_go_where_the_old_ones_were():
    leaves, spec = flatten(((TENSOR, [1, TENSOR]), {"out": TENSOR}))
    assert unflatten(["a", 1, "b", "c"], spec) == (("a", [1, "b"]), {"out": "c"})


def test_a_size_is_kept_whole_and_comes_back_a_size():
    leaves, spec = flatten(((TENSOR, torch.Size([2, 3])), {}))
    assert leaves[1] == torch.Size([2, 3]) and type(leaves[1]) is torch.Size
    assert type(unflatten(leaves, spec)[0][1]) is torch.Size


def test_containers_only_torch_opens_go_through_torchs_pytree():
    for tree in ((Pair(TENSOR, 1),), [OrderedDict(x=TENSOR)], torch.max(TENSOR, 0)):
        leaves, spec = flatten(tree)
        assert isinstance(spec, TreeSpec)
        assert [id(x) for x in leaves] == [id(x) for x in tree_flatten(tree)[0]]
        rebuilt = unflatten(leaves, spec)
        assert type(rebuilt) is type(tree) and tree_flatten(rebuilt)[1] == spec
