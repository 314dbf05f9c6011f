"""Every checker reads every rank: on 3 and 4 ranks where only the LAST rank breaks an
invariant, the full check fails on exactly that checker and names that rank. A checker cut
down to fewer ranks (rank 0 against rank 1, the first rank only) fails these."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from record_builders import (
    DEADLINE_S,
    FINGERPRINT,
    ROWS,
    SPLIT,
    STATE,
    config,
    reference,
    startup_records,
    step_records,
)

from harness.check.checkers import TOLERANCE
from harness.check.registry import check_startup, check_step
from harness.errors import ErrorOrigin
from harness.history.records import StartupRecord, StepRecord
from harness.history.step_error import StepError


def failing(verdicts) -> dict[str, str]:
    return {v.checker: v.detail for v in verdicts if not v.ok}


def names_rank(detail: str, rank: int) -> bool:
    """`rank R: ...`, or a group `ranks [R]` of its own."""
    return f"rank {rank}" in detail or f"ranks [{rank}]" in detail


def other_desc(rec: StepRecord) -> StepRecord:
    # The rank decided another graph and replayed it: only the agreement across ranks breaks.
    desc = replace(rec.plan.desc, num_tokens=64)
    return replace(rec, plan=replace(rec.plan, desc=desc), replayed=desc.label())


def with_empty_last_region(rec: StepRecord) -> StepRecord:
    # The split the replay ran puts the last region past the rank's 20-odd real tokens.
    return replace(rec, ran_split=((0, 24, 0, 24), (24, 32, 24, 32)))


STEP_BREAKS: dict[str, Callable[[StepRecord], StepRecord]] = {
    "liveness": lambda r: replace(r, seconds=DEADLINE_S + 1.0),
    "errors": lambda r: replace(r, error=StepError("ValueError", "bad row", None)),
    "agreement": other_desc,
    "collective_fingerprints": lambda r: replace(
        r, fingerprint=(("all_reduce", (7, 4), "int64"), FINGERPRINT[1])),
    "captured_split": lambda r: replace(r, replay_split=(SPLIT[0], (15, 32, 16, 32))),
    "no_empty_region": with_empty_last_region,
    "matches_reference": lambda r: replace(
        r, outputs=(ROWS[0], (ROWS[1][0] + 1e-8, ROWS[1][1]))),
    "routing_provenance": lambda r: replace(r, routes=r.routes[:1]),
    "thread_hygiene": lambda r: replace(r, threads_alive=("ubatch-1",)),
    # harness/check/execution.py
    "executes_plan": lambda r: replace(r, replayed="FULL/32tok/32req/uct1"),
    "split_consensus": lambda r: replace(r, ran_split=((0, 32, 0, 32),)),
    "dispatch_capacity": lambda r: replace(r, a2a_tokens_per_rank=15),
}


@pytest.mark.parametrize("ranks", [3, 4])
@pytest.mark.parametrize("checker", sorted(STEP_BREAKS))
def test_a_step_broken_on_the_last_rank_only_fails_that_checker_naming_it(checker, ranks):
    records = step_records(ranks)
    assert failing(check_step(records, reference(ranks), DEADLINE_S)) == {}
    records[-1] = STEP_BREAKS[checker](records[-1])
    failed = failing(check_step(records, reference(ranks), DEADLINE_S))
    assert set(failed) == {checker}, failed
    assert names_rank(failed[checker], ranks - 1), failed[checker]


@pytest.mark.parametrize("ranks", [3, 4])
def test_a_last_rank_that_never_returned_fails_liveness_alone(ranks):
    records: list[StepRecord | None] = list(step_records(ranks))
    records[-1] = None
    failed = failing(check_step(records, reference(ranks), DEADLINE_S))
    assert failed == {"liveness": f"ranks [{ranks - 1}] still running after the "
                                  f"{DEADLINE_S:.1f} s deadline"}


@pytest.mark.parametrize("ranks", [3, 4])
def test_another_system_deciding_otherwise_on_the_last_rank_only_fails_the_differential(ranks):
    records = step_records(ranks)
    judged = tuple(r.plan for r in records)
    assert failing(check_step(records, reference(ranks, judged), DEADLINE_S)) == {}
    # The last rank pads to another size than the reference; its descriptor is the same, so
    # the ranks still agree with each other and only the differential sees it.
    # It ran what it planned, so executes_plan holds.
    last = records[-1]
    records[-1] = replace(last, plan=replace(last.plan, num_tokens=40),
                          ran_split=(*last.ran_split[:-1], (*last.ran_split[-1][:3], 40)))
    failed = failing(check_step(records, reference(ranks, judged), DEADLINE_S))
    assert set(failed) == {"differential"}, failed
    assert failed["differential"].startswith(f"rank {ranks - 1}: padded_tokens: 40")


def test_rounding_matches_and_a_difference_of_1e_8_does_not():
    # Absolute numbers, not TOLERANCE: a looser tolerance must fail here. Rounding between
    # the float64 reference and a device run is ~1e-15 at these magnitudes.
    assert 1e-12 < TOLERANCE < 1e-8
    records = step_records(3)
    near = replace(records[-1], outputs=(ROWS[0], (ROWS[1][0] + 1e-12, ROWS[1][1])))
    assert failing(check_step([*records[:-1], near], reference(3), DEADLINE_S)) == {}
    far = replace(records[-1], state=((0.5 + 1e-8, 0.5), STATE[1]))
    failed = failing(check_step([*records[:-1], far], reference(3), DEADLINE_S))
    assert failed == {"matches_reference": "rank 2 state of request slot 0 differs from the "
                                           "reference"}


def unreachable(rec: StartupRecord) -> StartupRecord:
    # Two tokens a request, where every decode has one; the rank still claims a batch of 32
    # reaches it: the judge asks the spec, not the rank.
    return replace(rec, graphs=(replace(rec.graphs[0], label="FULL/32tok/16req/uct2/ub2"),))


STARTUP_BREAKS: dict[str, Callable[[StartupRecord], StartupRecord]] = {
    "startup": lambda r: replace(r, error=StepError("CaptureError", "capture failed", None)),
    "capture_hygiene": lambda r: replace(r, pending_run=True),
    "graphs_capture_work": lambda r: replace(r, graphs=(replace(r.graphs[0], empty=True),)),
    "capture_symmetry": lambda r: replace(r, planned=(*r.planned, "FULL/16tok/16req/uct1")),
    "graphs_reachable": unreachable,
}


@pytest.mark.parametrize("ranks", [3, 4])
@pytest.mark.parametrize("checker", sorted(STARTUP_BREAKS))
def test_a_capture_broken_on_the_last_rank_only_fails_that_checker_naming_it(checker, ranks):
    records = startup_records(ranks)
    assert failing(check_startup(records, DEADLINE_S, config(ranks))) == {}
    records[-1] = STARTUP_BREAKS[checker](records[-1])
    failed = failing(check_startup(records, DEADLINE_S, config(ranks)))
    assert set(failed) == {checker}, failed
    assert names_rank(failed[checker], ranks - 1), failed[checker]


def test_a_hang_on_the_last_rank_is_a_liveness_failure_whatever_its_message():
    records = step_records(4)
    hang = StepError("RuntimeError", "stuck", None, ErrorOrigin.HANG)
    records[-1] = replace(records[-1], error=hang)
    assert failing(check_step(records, reference(4), DEADLINE_S))["liveness"].startswith(
        "rank 3 hung")
