"""The GPU benches' one clock: the median of a step's time, by CUDA events on a GPU and by the
wall clock on the CPU. `gpu` and the ranks of `gpu_dp` both time with it."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def timed(fn: Callable[[], None], device: torch.device, warmup: int, iters: int) -> float:
    """Median milliseconds of `fn` after `warmup` calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(1000 * (time.perf_counter() - t0))
    return statistics.median(samples)
