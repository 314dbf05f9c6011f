"""The draws of the nemesis: one fault of the kinds a search plants, aimed where it fires
(docs/spec.md §5)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hypothesis import strategies as st

from harness.config import HarnessConfig
from harness.faults import VLLM_EXEC_FAULTS, Fault, FaultKind

SLOW_UBATCH_SECONDS = (0.1, 0.4)  # below the fuzzer's collective bound: slow, never failed
# Faults of a microbatch thread: they fire only in a step whose threads run.
THREAD_FAULTS = frozenset((FaultKind.RAISE_IN_UBATCH, FaultKind.RETURN_WITHOUT_YIELDING,
                           *VLLM_EXEC_FAULTS))


@st.composite
def faults(draw, config: HarnessConfig, num_steps: int, kinds: Sequence[FaultKind],
           threaded_steps: Sequence[int] = ()) -> tuple[Fault, ...]:
    """One fault of the given kinds, on any rank, step and microbatch. A thread's fault is
    aimed at a step whose microbatch threads run (`threaded_steps`) where there is one: it
    fires only there, and with many ranks such steps are rare among those drawn; a rank's
    fault three draws in four (docs/spec.md §5)."""
    if not kinds:
        return ()
    kind = draw(st.sampled_from(kinds))
    aimed = threaded_steps and (kind in THREAD_FAULTS or draw(st.integers(0, 3)) > 0)
    step = st.sampled_from(threaded_steps) if aimed else st.integers(0, num_steps - 1)
    fault = Fault(kind, draw(st.integers(0, config.serving.dp_size - 1)), draw(step),
                  draw(st.integers(0, max(config.num_ubatches, 1) - 1)))
    if kind is FaultKind.SLOW_UBATCH:
        fault = replace(fault, seconds=draw(st.sampled_from(SLOW_UBATCH_SECONDS)))
    return (fault,)
