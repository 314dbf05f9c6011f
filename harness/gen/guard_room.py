"""Capture sizes that leave a microbatched config's guard something to decide.

A twin of G tokens split k ways replays only steps whose smallest rank reaches the microbatching
threshold (at least k), and the guard decides between the twin and eager only for a smallest
rank at or below its last region start, about G (k - 1) / k. Under about 4k tokens the two
meet: every split step fills the twin (or none splits), and no step of the config asks the
guard, the split's cut or a region's emptiness anything. Hypothesis's early examples keep the
simplest draws (the smallest size), so without this such configs would fill a short search's
start: with k = 3 or 4, half the configs that capture twins had none with room.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

# Tokens per region a twin needs for a light rank to sit either side of a region start above
# the threshold.
ROOM_PER_REGION = 4
# One tight config in this many keeps its sizes as drawn (they stay in the space).
KEEP_TIGHT_EVERY = 4


def has_room(sizes: Sequence[int], num_ubatches: int) -> bool:
    """Whether some capture size gives each of the k regions room (a config that does not
    microbatch needs none)."""
    return num_ubatches < 2 or any(s >= ROOM_PER_REGION * num_ubatches for s in sizes)


@st.composite
def sizes_with_room(draw, sizes: list[int] | None, num_ubatches: int,
                    choices: Sequence[int]) -> list[int] | None:
    """`sizes`, joined by one of `choices` with room where none has it, but for one tight
    config in KEEP_TIGHT_EVERY; the simplest draw adds the smallest such size."""
    roomy = [s for s in choices if s >= ROOM_PER_REGION * num_ubatches]
    if not sizes or not roomy or has_room(sizes, num_ubatches):
        return sizes
    if draw(st.integers(0, KEEP_TIGHT_EVERY - 1)) == KEEP_TIGHT_EVERY - 1:
        return sizes
    return sorted({*sizes, draw(st.sampled_from(roomy))})
