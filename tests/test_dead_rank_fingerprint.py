"""A rank that died before reporting a step has an unknown collective fingerprint, not an empty
one: collective_fingerprints leaves it out and names it, and still compares the survivors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.check.checkers import check_fingerprints
from harness.check.verdict import Outcome
from harness.errors import ErrorOrigin
from harness.history.records import StepRecord
from harness.history.step_error import StepError

FINGERPRINT = (("all_reduce", (7, 4), "int32"), ("all_to_all", (258, 19), "float64"))
CRASH = StepError("RankCrashed", "died of a fatal signal (Aborted)", None, ErrorOrigin.CRASHED)


def survivor(rank: int) -> StepRecord:
    # What a live rank reports once its peer died: the collectives it issued, then its error.
    return replace(StepRecord.failed(rank, 0, StepError("CollectiveTimeout", "peer gone")),
                   fingerprint=FINGERPRINT)


def test_a_rank_that_never_reported_has_an_unknown_fingerprint():
    assert StepRecord.failed(1, 0, CRASH).fingerprint is None
    assert StepRecord.failed(1, 0, CRASH).to_dict()["fingerprint"] is None


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_a_dead_last_rank_is_left_out_and_named_not_read_as_issuing_nothing(ranks):
    records = [survivor(r) for r in range(ranks - 1)] + [StepRecord.failed(ranks - 1, 0, CRASH)]
    verdict = check_fingerprints(records)
    assert verdict.ok, verdict.detail
    left_out = f"ranks [{ranks - 1}] left out: their collectives are unknown"
    if ranks == 2:  # one known rank compares with nothing: not applicable, never held
        assert verdict.outcome is Outcome.NOT_APPLICABLE and verdict.detail == (
            f"1 rank(s) with known collectives: nothing to compare ({left_out})")
    else:
        assert verdict.outcome is Outcome.HELD and verdict.detail == left_out


@pytest.mark.parametrize("ranks", [3, 4])
def test_survivors_that_differ_are_still_caught_beside_a_dead_first_rank(ranks):
    records = [StepRecord.failed(0, 0, CRASH)] + [survivor(r) for r in range(1, ranks)]
    records[-1] = replace(records[-1], fingerprint=FINGERPRINT[:1])
    verdict = check_fingerprints(records)
    assert not verdict.ok
    assert verdict.detail == (f"collective #1: rank 1 issues {FINGERPRINT[1]}, rank "
                              f"{ranks - 1} issues None (ranks [0] left out: their collectives "
                              "are unknown)")


def test_a_rank_that_reported_no_collectives_still_differs_from_one_that_issued_some():
    # Known-empty is a fingerprint like any other: only the unknown one is left out.
    records = [survivor(0), replace(survivor(1), fingerprint=())]
    verdict = check_fingerprints(records)
    assert not verdict.ok and verdict.detail.startswith("collective #0: rank 0 issues")


def test_every_rank_dead_leaves_nothing_to_compare_and_says_so():
    verdict = check_fingerprints([StepRecord.failed(r, 0, CRASH) for r in range(3)])
    assert verdict.outcome is Outcome.NOT_APPLICABLE and verdict.detail == (
        "0 rank(s) with known collectives: nothing to compare (ranks [0, 1, 2] left out: their "
        "collectives are unknown)")
