"""Pausing Python's cyclic garbage collector while ranks are inside collectives.

A full collection stops every thread of a process for up to ~0.6 s once a fuzz run has
built a few hundred thousand objects, while the gloo timer of a peer waiting in C++ keeps
running: with second-long fuzz timeouts that reads as a hung peer. Collections are left to
the quiet moments between scenarios instead.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
