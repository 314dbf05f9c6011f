"""How a controlled schedule picks the next thread at a scheduling point.

`choose(step, at, candidates)` is asked at every point: `step` counts the points of the run,
`at` is the thread at the point (a candidate only when it could go on), `candidates` the
threads that could run, ascending. Only points with two or more candidates are recorded.
"""

from __future__ import annotations

import random
from typing import Protocol

from harness.runtime.schedule.bounded import BoundedPreemptions
from harness.runtime.schedule.descriptor import Schedule


class Strategy(Protocol):
    def choose(self, step: int, at: int, candidates: tuple[int, ...]) -> int:
        """The thread to run next, one of `candidates`."""


def non_preemptive(at: int, candidates: tuple[int, ...]) -> int:
    """Go on with the thread at the point; else the lowest-numbered runnable one."""
    return at if at in candidates else candidates[0]


class NonPreemptive:
    """The default of exhaustive search past its prefix: never preempt."""

    def choose(self, step: int, at: int, candidates: tuple[int, ...]) -> int:
        return non_preemptive(at, candidates)


class RandomChoice:
    """Uniform among the candidates, from a seeded generator drawn only at real choices."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def choose(self, step: int, at: int, candidates: tuple[int, ...]) -> int:
        if len(candidates) == 1:
            return candidates[0]
        return self._rng.choice(candidates)


class Pct:
    """Probabilistic concurrency testing (Burckhardt et al., ASPLOS 2010).

    Each thread gets a random priority >= depth when first seen; at `depth` - 1 points drawn
    from 1..steps the thread at the point drops to priority i (below every initial one). The
    highest-priority candidate runs. A bug of depth d is found with probability at least
    1 / (n * steps^(d-1)) per run for n threads.
    """

    def __init__(self, seed: int, depth: int, steps: int) -> None:
        self._rng = random.Random(seed)
        self._depth = depth
        changes = min(depth - 1, steps)
        # Sorted descending so the next change point is popped from the end.
        self._changes = sorted(self._rng.sample(range(1, steps + 1), changes), reverse=True)
        self._lowered = 0
        self._priority: dict[int, float] = {}

    def choose(self, step: int, at: int, candidates: tuple[int, ...]) -> int:
        for thread in (at, *candidates):
            if thread not in self._priority:
                self._priority[thread] = self._depth + self._rng.random()
        while self._changes and self._changes[-1] <= step:
            self._changes.pop()
            self._lowered += 1
            self._priority[at] = self._depth - self._lowered  # below every initial priority
        return max(candidates, key=lambda t: (self._priority[t], -t))


class Replay:
    """Follow `choices` at the points with two or more candidates, then `then`."""

    def __init__(self, choices: tuple[int, ...], then: Strategy) -> None:
        self._choices = choices
        self._next = 0
        self._then = then

    def choose(self, step: int, at: int, candidates: tuple[int, ...]) -> int:
        if len(candidates) < 2 or self._next >= len(self._choices):
            return self._then.choose(step, at, candidates)
        choice = self._choices[self._next]
        self._next += 1
        if choice not in candidates:
            raise ReplayMismatch(self._next - 1, choice, candidates)
        return choice


class ReplayMismatch(Exception):
    """Replayed choice `index` names a thread that cannot run at that point."""

    def __init__(self, index: int, choice: int, candidates: tuple[int, ...]) -> None:
        super().__init__(f"replayed choice {index} is thread {choice}, but only threads "
                         f"{list(candidates)} can run there")


def strategy_for(schedule: Schedule) -> Strategy:
    """The strategy of a controlled schedule, behind its recorded choices if it has any."""
    base: Strategy
    if schedule.mode == "random":
        base = RandomChoice(schedule.seed)
    elif schedule.mode == "pct":
        base = Pct(schedule.seed, schedule.depth, schedule.steps)
    elif schedule.mode == "exhaustive":
        # Seed 0 never preempts (explore's default); another numbers one bounded schedule.
        base = (BoundedPreemptions(schedule.seed, schedule.preemptions, schedule.steps)
                if schedule.seed else NonPreemptive())
    else:
        raise ValueError(f"schedule mode {schedule.mode!r} is not controlled")
    return Replay(schedule.choices, base) if schedule.choices else base
