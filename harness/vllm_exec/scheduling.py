"""vLLM's microbatch threads under a controlled schedule: the one place their handoffs are
routed (docs/schedules.md, "vLLM's ubatching.py"), beside the stand-ins (stand_ins.py).

For a controlled step, and only for its duration, the modules under test (a patched copy
included) see the step's primitives:

- `threading` of `vllm.v1.worker.ubatching` (the `cpu_events` of `make_ubatch_contexts`)
  and of `vllm.v1.worker.gpu.ubatch_utils` (`UBatchRunner`'s microbatch threads) is a
  namespace whose `Event` and `Thread` are the schedule's, the rest threading's own;
- the runner's `ready_barrier`, built with the runner, is the schedule's barrier;
- scheduling points: `UBatchContext.update_stream` (every comm/compute switch, the yields'
  included), `dbo_register_recv_hook`, and the running of every hook it stores (wherever
  a context runs it, its way out included).

Everything is put back when the step ends, so under `os` vLLM's code runs untouched. A rank is
a process (vLLM's ubatching state is module-global): one controlled step at a time.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from harness.runtime.schedule.descriptor import OS_SCHEDULE, Schedule
from harness.runtime.schedule.primitives import Primitives
from harness.runtime.schedule.step import StepSchedule, scheduled_step


class _RoutedThreading:
    """`threading` for a vLLM module during a controlled step."""

    def __init__(self, primitives: Primitives) -> None:
        self._p = primitives
        self._events = itertools.count()

    def Event(self) -> Any:
        return self._p.event(f"cpu_event[{next(self._events)}]")

    def Thread(self, group: None = None, target: Callable[..., Any] | None = None,
               name: str | None = None, args: tuple = (), kwargs: dict | None = None, *,
               daemon: bool | None = None) -> threading.Thread:
        if target is None or kwargs:
            raise TypeError("a scheduled vLLM thread takes a target and positional args")
        # vLLM's threads are unnamed; the harness finds them by their target's name.
        ubatch = getattr(args[0], "id", None) if args else None
        label = name or f"ubatch-{ubatch} ({getattr(target, '__name__', 'thread')})"
        return self._p.thread(target, label, args, daemon=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(threading, name)  # get_ident, Lock, ...: threading's own


def _hook_point(primitives: Primitives, hook: Callable[[], Any]) -> Callable[[], Any]:
    def run_recv_hook() -> Any:
        primitives.point("recv_hook")
        return hook()

    return run_recv_hook


class VllmScheduling:
    """Routes one rank's vLLM ubatching modules through a controlled step's primitives."""

    def __init__(self, ubatching: ModuleType, runner_module: ModuleType, runner: Any,
                 safety_s: float, rank: int) -> None:
        self.ubatching = ubatching
        self.runner_module = runner_module
        self.runner = runner  # None without microbatching: nothing to route
        self.safety_s = safety_s
        self.rank = rank

    @contextmanager
    def step(self, schedule: Schedule) -> Iterator[StepSchedule]:
        if self.runner is None:
            schedule = OS_SCHEDULE
        with scheduled_step(schedule, self.safety_s, f"rank {self.rank}") as step:
            if not schedule.controlled:
                yield step
                return
            with self.routed(step.primitives):
                yield step

    @contextmanager
    def routed(self, primitives: Primitives) -> Iterator[None]:
        """The modules routed through `primitives` for the block (a run `explore` drives
        with its own scheduler: harness/vllm_exec/proof.py)."""
        u, context = self.ubatching, self.ubatching.UBatchContext
        update_stream, register = context.update_stream, u.dbo_register_recv_hook

        def update_stream_point(ctx: Any, stream: Any) -> None:
            primitives.point(f"ub{ctx.id}.update_stream")
            update_stream(ctx, stream)

        def register_point(recv_hook: Callable[[], Any]) -> None:
            primitives.point("register_recv_hook")
            register(_hook_point(primitives, recv_hook))

        runner = self.runner
        routed = [(u, "threading", _RoutedThreading(primitives)),
                  (self.runner_module, "threading", _RoutedThreading(primitives)),
                  (runner, "ready_barrier", primitives.barrier(runner.num_ubatches + 1,
                                                               "ready")),
                  (context, "update_stream", update_stream_point),
                  (u, "dbo_register_recv_hook", register_point)]
        saved = [(owner, name, vars(owner)[name]) for owner, name, _ in routed]
        try:
            for owner, name, value in routed:
                setattr(owner, name, value)
            yield
        finally:
            for owner, name, value in saved:
                setattr(owner, name, value)
