"""What the two exhaustive proofs share (the ring's, harness/runtime/ubatching/proof.py, and
vLLM's ubatching's, harness/vllm_exec/proof.py): a step's shape, how many schedules a proof
runs, and the receive order a clean step must show."""

from __future__ import annotations

from collections.abc import Sequence

from harness.runtime.schedule.descriptor import Schedule


def check_step_shape(k: int, stage: str, faulty: int, stages: Sequence[str]) -> None:
    """k microbatches, a known fault stage, the faulty one among them: else ValueError."""
    if k < 2:
        raise ValueError(f"k: microbatching needs at least 2 microbatches, got {k}")
    if stage not in stages:
        raise ValueError(f"stage: {stage!r} is not one of {', '.join(stages)}")
    if not 0 <= faulty < k:
        raise ValueError(f"faulty: {faulty} is not a microbatch of {k}")


def proof_runs(schedule: Schedule, runs: int | None) -> int:
    """Every schedule under exhaustive (unless `runs` caps it), else `runs` (100 by default)."""
    if runs is not None:
        return runs
    return 10**9 if schedule.mode == "exhaustive" else 100


def receive_problem(k: int, skipped: int | None, exchanges: int,
                    delivered: list[tuple[int, int]],
                    read_early: list[tuple[int, int]]) -> str | None:
    """Each microbatch's receives (but a skipped one's) completed once, none read before."""
    want = sorted((i, x) for i in range(k) if i != skipped for x in range(exchanges))
    if sorted(delivered) != want:
        return f"receives completed {sorted(delivered)}, expected each of {want} once"
    if read_early:
        return f"data read before its receive completed: {read_early}"
    return None
