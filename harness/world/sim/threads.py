"""N ranks as threads of one process, each with a real gloo group over a shared store.

Real gloo groups (not the threaded test backend) so that a skipped or stuck collective
raises after the group timeout exactly as it does between processes. The groups live as
long as the world: a group dropped by one rank closes its pairs on every peer.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from harness.errors import ErrorOrigin
from harness.runtime.process_group import as_process_group
from harness.timeouts import gloo_init_wait_s, thread_run_wait_s
from harness.world.vllm_slots import register_vllm_code

_world_ids = itertools.count()


class RankFailure(RuntimeError):
    """One or more ranks raised; names the lowest failed rank and chains its exception."""

    def __init__(self, errors: dict[int, BaseException]) -> None:
        self.errors = dict(sorted(errors.items()))
        rank, error = next(iter(self.errors.items()))
        others = f" (ranks {sorted(self.errors)} failed)" if len(self.errors) > 1 else ""
        super().__init__(f"rank {rank} failed: {type(error).__name__}: {error}{others}")


class RankHang(RuntimeError):
    """Ranks still running at the deadline; their threads are abandoned (daemon)."""

    origin = ErrorOrigin.HANG

    def __init__(self, ranks: list[int], deadline_s: float) -> None:
        self.ranks = ranks
        super().__init__(f"ranks {ranks} did not finish within {deadline_s:.1f} s")


def new_gloo_group(store, rank: int, size: int, timeout_s: float):
    """A gloo group of one host (bound to loopback), as a ProcessGroup."""
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timedelta(seconds=timeout_s)
    # Every rank is on this host: bind to loopback, never to whatever the hostname resolves to.
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    # Wrapped so collectives go through the dispatcher, where a graph capture can see them.
    return as_process_group(dist.ProcessGroupGloo(store, rank, size, options))


def run_in_threads(size: int, fn: Callable[[int], Any], deadline_s: float,
                   name: str = "rank") -> list[Any]:
    """Run fn(rank) for every rank in its own thread; bounded by `deadline_s` in all."""
    results, stuck, errors = _run_bounded(size, fn, deadline_s, name)
    if stuck:
        raise RankHang(stuck, deadline_s)
    if errors:
        raise RankFailure(errors)
    return results


def run_bounded(size: int, fn: Callable[[int], Any], deadline_s: float,
                name: str = "rank") -> tuple[list[Any], list[int]]:
    """Like run_in_threads for code that never raises: results (None for a rank still running
    at the deadline) and the ranks still running."""
    results, stuck, errors = _run_bounded(size, fn, deadline_s, name)
    if errors:
        raise RankFailure(errors)
    return results, stuck


def _run_bounded(size: int, fn: Callable[[int], Any], deadline_s: float, name: str):
    results: list[Any] = [None] * size
    errors: dict[int, BaseException] = {}

    def body(rank: int) -> None:
        try:
            results[rank] = fn(rank)
        except BaseException as exc:  # reported per rank below
            errors[rank] = exc

    threads = [threading.Thread(target=body, args=(r,), name=f"{name}-{r}", daemon=True)
               for r in range(size)]
    for t in threads:
        t.start()
    end = time.monotonic() + deadline_s
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    stuck = [r for r, t in enumerate(threads) if t.is_alive()]
    return results, stuck, {r: e for r, e in errors.items() if r not in stuck}


class ThreadWorld:
    """A DP world of `size` thread ranks; use as a context manager, then `run`."""

    def __init__(self, size: int, timeout_s: float = 5.0) -> None:
        register_vllm_code()  # its ranks may run vLLM's decision code
        self.size = size
        self.timeout_s = timeout_s
        self.groups: list[Any] = []
        self._store = dist.HashStore()
        self._prefix = f"threadworld-{next(_world_ids)}"

    def __enter__(self) -> ThreadWorld:
        store = dist.PrefixStore(self._prefix, self._store)
        # Group construction is itself a rendezvous: every rank must build concurrently.
        self.groups = run_in_threads(
            self.size, lambda r: new_gloo_group(store, r, self.size, self.timeout_s),
            deadline_s=gloo_init_wait_s(self.timeout_s), name="gloo-init")
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self.groups = []

    def run(self, fn: Callable[[int, Any], Any], deadline_s: float | None = None) -> list[Any]:
        """fn(rank, group) on every rank at once; returns results in rank order."""
        return run_in_threads(self.size, self._bind(fn), self._deadline(deadline_s))

    def run_bounded(self, fn: Callable[[int, Any], Any],
                    deadline_s: float | None = None) -> tuple[list[Any], list[int]]:
        """fn(rank, group) on every rank; also returns the ranks still running at the deadline."""
        return run_bounded(self.size, self._bind(fn), self._deadline(deadline_s))

    def _bind(self, fn: Callable[[int, Any], Any]) -> Callable[[int], Any]:
        if not self.groups:
            raise RuntimeError("ThreadWorld.run outside its `with` block")
        return lambda rank: fn(rank, self.groups[rank])

    def _deadline(self, deadline_s: float | None) -> float:
        return deadline_s if deadline_s is not None else thread_run_wait_s(self.timeout_s)
