"""The draws of the nemesis: one fault of the kinds a search plants, aimed where it fires
(docs/spec.md §5)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hypothesis import strategies as st

from harness.config import HarnessConfig
from harness.faults import Fault, FaultKind

SLOW_UBATCH_SECONDS = (0.1, 0.4)  # below the fuzzer's collective bound: slow, never failed


@st.composite
def faults(draw, config: HarnessConfig, num_steps: int, kinds: Sequence[FaultKind],
           threaded_steps: Sequence[int] = ()) -> tuple[Fault, ...]:
    """One fault of the given kinds, on any rank, step and microbatch. Three draws in four
    aim at a step whose microbatch threads run (`threaded_steps`): a microbatch fault fires
    only there, and with many ranks such steps are rare among those drawn (docs/spec.md §5)."""
    if not kinds:
        return ()
    aimed = threaded_steps and draw(st.integers(0, 3)) > 0
    step = st.sampled_from(threaded_steps) if aimed else st.integers(0, num_steps - 1)
    kind = draw(st.sampled_from(kinds))
    fault = Fault(kind, draw(st.integers(0, config.serving.dp_size - 1)), draw(step),
                  draw(st.integers(0, max(config.num_ubatches, 1) - 1)))
    if kind is FaultKind.SLOW_UBATCH:
        fault = replace(fault, seconds=draw(st.sampled_from(SLOW_UBATCH_SECONDS)))
    return (fault,)
