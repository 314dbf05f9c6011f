"""The draws of dead DP ranks under fault tolerance (docs/spec.md §1.7): which ranks die, at
which step, and at which step each survivor is told. Shrunk, the simplest scenario has no
death, and a death every survivor learns of at once; a later learning is kept only where it
is what fails."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from harness.batch import RankBatch
from harness.config import HarnessConfig
from harness.dead_ranks import with_silent_members

# About one fault-tolerant scenario in this many has no death (the config alone).
DEATH_EVERY = 4


def applied_deaths(steps: Sequence[Sequence[RankBatch]], died: dict[int, int],
                   told: dict[tuple[int, int], int]) -> list[tuple[RankBatch, ...]]:
    """`steps` with each rank of `died` (rank -> step) idle and dead from its step on, and
    each survivor r told of dead rank d from step told[(r, d)] on."""
    out = []
    for i, step in enumerate(steps):
        batches = []
        for r, batch in enumerate(step):
            if r in died and i >= died[r]:
                batches.append(RankBatch.uniform(0).with_deaths((), dead=True))
                continue
            knows = [d for d, at in died.items() if i >= at and i >= told[(r, d)]]
            batches.append(batch.with_deaths(knows))
        out.append(with_silent_members(batches))
    return out


@st.composite
def deaths(draw, config: HarnessConfig,
           steps: Sequence[Sequence[RankBatch]]) -> list[tuple[RankBatch, ...]]:
    """Up to dp_size - 1 ranks (two at most) die, each at a step of the scenario; each
    survivor is told at that step or later (past the last step: never within the run)."""
    dp, n = config.serving.dp_size, len(steps)
    if not config.serving.fault_tolerance or draw(st.integers(0, DEATH_EVERY - 1)) == 0:
        return [tuple(s) for s in steps]
    count = draw(st.integers(1, min(2, dp - 1)))
    ranks = draw(st.lists(st.integers(0, dp - 1), min_size=count, max_size=count,
                          unique=True))
    died = {d: draw(st.integers(0, n - 1)) for d in ranks}
    told = {(r, d): at + draw(st.integers(0, n - at))
            for d, at in died.items() for r in range(dp) if r != d}
    return applied_deaths(steps, died, told)
