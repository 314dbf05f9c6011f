"""When a microbatch thread's missing cuBLAS warm-up shows on CUDA, and how to make it show.

torch keeps one pool of cuBLAS handles per process: a thread takes a free handle on its
first matmul and gives it back when it exits. A thread whose first matmul happens inside a
capture and finds no free handle calls cublasCreate there, which fails
(CUBLAS_STATUS_NOT_INITIALIZED) and invalidates the capture: the seed's hazard. A free handle
left by a thread that has exited (the warmup step's microbatch threads, say) masks it, so
skipping the warm-up can pass unnoticed (measured on torch 2.11 / H200). The warm-up in the
runner takes (or creates) the handle before the ready barrier, outside the capture, either
way. `drain_cublas_handles_at_capture` takes every free handle away (for good) before each
microbatched capture, so the hazard shows whenever the warm-up is missing. It wraps the
rank runtime's runner by its method's name: nothing here imports the rank code.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

# More than the free handles a process holds between two captures: one per thread that
# held one at a time since the last drain (two microbatch threads, the main thread, a few).
DEFAULT_HOLDERS = 16
HOLD_S = 3600.0


def hold_free_cublas_handles(device: torch.device, holders: int = DEFAULT_HOLDERS) -> None:
    """Take the free cuBLAS handles away for good: `holders` daemon threads each take one
    (a free one first, else a new one) and park until the process exits. Parked for good,
    because a holder that exits gives its handle back and the pool would only grow."""
    ready = threading.Barrier(holders + 1, timeout=30.0)
    failures: list[BaseException] = []

    def hold() -> None:
        try:
            torch.cuda.set_device(device)
            torch.cuda.current_blas_handle()  # takes a free handle, or creates one
        except BaseException as exc:  # reported below
            failures.append(exc)
        try:
            ready.wait()
        except threading.BrokenBarrierError:
            return
        # Parked (a daemon thread, gone at exit); bounded like every wait, well past any run.
        threading.Event().wait(HOLD_S)

    for i in range(holders):
        threading.Thread(target=hold, name=f"cublas-holder-{i}", daemon=True).start()
    ready.wait()
    if failures:
        raise RuntimeError(f"a holder could not take a cuBLAS handle: {failures[0]}")


def drain_cublas_handles_at_capture(runtime, holders: int = DEFAULT_HOLDERS) -> None:
    """Make every microbatched capture of `runtime` start with no free cuBLAS handle: the
    runner's threads then create theirs, in their warm-up or (without one) in the capture."""
    runner = runtime.runner
    begin: Callable = runner.begin_capturable_run
    device = runtime.device

    def begin_drained(*args, for_capture: bool = False, **kwargs):
        if for_capture:
            hold_free_cublas_handles(device, holders)
        return begin(*args, for_capture=for_capture, **kwargs)

    runner.begin_capturable_run = begin_drained
