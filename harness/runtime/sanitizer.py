"""PyTorch's CUDA sanitizer (`TORCH_CUDA_SANITIZER=1`) in microbatch threads.

The sanitizer is a dispatch mode entered once, in the thread that imports torch; dispatch
modes are per thread, so it never sees the tensor accesses of the threads a microbatched step
runs on, where every handoff between the compute and comm streams happens (measured:
docs/measurements.md, "Stream order"). Its stream and event hooks are process-wide, so
entering its one mode in each microbatch thread is all it lacks. torch exposes no public way
to do that: this is the one place the harness reaches into `torch.cuda._sanitizer`.

The sanitizer judges an op by its schema, and c10d's all-to-all (`alltoall_base_`) marks no
argument written, so an all-to-all's receive looks like a read to it: `announce_written`
tells it of the write (docs/spec.md, "Stream order").
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack


def _enabled_mode():
    """The sanitizer's dispatch mode, when it is on in this process; else None."""
    # Never imported here: importing the module turns on CUDA's trace hooks for the whole
    # process (its mode's constructor does), which then wrap every event and sync in Python
    # and turned a cuBLAS failure in a capture into a SystemError. TORCH_CUDA_SANITIZER=1
    # makes torch import it.
    _sanitizer = sys.modules.get("torch.cuda._sanitizer")
    sanitizer = getattr(_sanitizer, "cuda_sanitizer", None)
    return sanitizer.dispatch if sanitizer is not None and sanitizer.enabled else None


@contextlib.contextmanager
def sanitized_thread() -> Iterator[None]:
    """Run the block under the sanitizer's mode in this thread too, when it is on and the
    thread is not under it yet (the main thread, a nested call)."""
    mode = _enabled_mode()
    if mode is None or mode in _get_current_dispatch_mode_stack():
        yield
        return
    with mode:
        yield


def announce_written(tensor: torch.Tensor) -> None:
    """Show the sanitizer a write of `tensor` on the current stream, when it is on: a copy of
    the tensor onto itself, which its schema marks written and ATen returns from at once."""
    if tensor.is_cuda and _enabled_mode() is not None:
        tensor.copy_(tensor)
