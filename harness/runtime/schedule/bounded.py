"""One run's schedule of an exhaustive series, picked by its number (`Schedule.seed`).

A run of `run` or `fuzz` is one example, so `--schedule exhaustive` there cannot walk the tree
of choices the way `explore` does; instead its seed numbers the schedules with at most
`preemptions` preemptions over the first `steps` preemption opportunities (points where the
running thread could go on and another could run): 0 is the run that never preempts, 1 to
`steps` preempt once (at opportunity seed - 1), then every pair, and so on, each set in
lexicographic order. A smaller number is never more preemptions, so a search that shrinks
the number toward 0 shrinks the preemptions. A preempted thread hands the turn to the next
runnable thread after it in thread order (wrapping round); `explore` also tries the others.
"""

from __future__ import annotations

from math import comb


def schedules_within(preemptions: int, horizon: int) -> int:
    """How many schedules the numbering has: sets of at most `preemptions` opportunities."""
    return sum(comb(horizon, size) for size in range(preemptions + 1))


def preemption_points(number: int, preemptions: int, horizon: int) -> frozenset[int]:
    """The opportunities (0-based, in run order) schedule `number` preempts at."""
    if not 0 <= number < schedules_within(preemptions, horizon):
        raise ValueError(f"schedule {number} is not one of the "
                         f"{schedules_within(preemptions, horizon)} schedules with at most "
                         f"{preemptions} preemptions over {horizon} opportunities")
    for size in range(preemptions + 1):
        if number < comb(horizon, size):
            return frozenset(_unranked(number, horizon, size))
        number -= comb(horizon, size)
    raise AssertionError("unreachable: the number was checked against the count")


def _unranked(rank: int, n: int, k: int) -> list[int]:
    """The `rank`-th k-subset of range(n) in lexicographic order."""
    chosen: list[int] = []
    start = 0
    for slot in range(k):
        for x in range(start, n):
            below = comb(n - x - 1, k - slot - 1)  # subsets that take x here
            if rank < below:
                chosen.append(x)
                start = x + 1
                break
            rank -= below
    return chosen


class BoundedPreemptions:
    """Never preempt, except at the opportunities the schedule's number names."""

    def __init__(self, number: int, preemptions: int, horizon: int) -> None:
        self._points = preemption_points(number, preemptions, horizon)
        self._seen = 0  # preemption opportunities met so far

    def choose(self, step: int, at: int, candidates: tuple[int, ...]) -> int:
        if at not in candidates:
            return candidates[0]  # a free switch: the thread at the point cannot go on
        if len(candidates) == 1:
            return at
        opportunity = self._seen
        self._seen += 1
        if opportunity not in self._points:
            return at
        others = [c for c in candidates if c != at]
        return next((c for c in others if c > at), others[0])
