"""`--dist loadgroup` that groups again under pytest 9.2 (a pytest plugin; conftest.py loads it).

pytest-xdist 3.8 sends the tests of one `xdist_group` to one worker by appending "@group" to
their node ids in the worker; pytest 9.2 keeps a node's id in a structured field, so that
suffix no longer lands (pytest-dev/pytest-xdist#1386) and every test is scheduled alone: each
worker booted a module's world of its own, and booted it again whenever it came back to the
module. This plugin writes the suffix where pytest keeps the id, only where xdist's did not
land, so it does nothing under a pytest or an xdist that groups by itself.
"""

from __future__ import annotations

import pytest


def group_of(item: pytest.Item) -> str | None:
    """The item's group as xdist names it: its `xdist_group` names, sorted, joined by '_'."""
    names = {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
             for mark in item.iter_markers("xdist_group")}
    return "_".join(sorted(names)) or None


def _set_node_id(item: pytest.Item, node_id: str) -> None:
    if hasattr(item, "_id"):  # pytest >= 9.2: the structured id the string is made from
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(node_id)
    else:
        item._nodeid = node_id


@pytest.hookimpl(trylast=True)  # after xdist's own hook, so its suffix is seen where it landed
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Set in xdist's workers only, whose collected ids the scheduler reads.
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        group = group_of(item)
        if group is not None and not item.nodeid.endswith(f"@{group}"):
            _set_node_id(item, f"{item.nodeid}@{group}")
