"""Checkers are pure functions over records: each one fails on a record that breaks its
invariant, and names the rank."""

from __future__ import annotations

from dataclasses import replace

from harness.batch import RankBatch
from harness.check.checkers import (
    check_errors,
    check_fingerprints,
    check_liveness,
    check_no_empty_region,
    check_reference,
    check_replay_split,
    check_routing,
    check_thread_hygiene,
)
from harness.check.reference import ReferenceRows
from harness.check.registry import check_step
from harness.config import HarnessConfig
from harness.errors import ErrorOrigin
from harness.history.records import StepRecord
from harness.history.step_error import StepError
from harness.sut.step_plan import plan_without_world

CONFIG = HarnessConfig.of(capture_sizes=(16, 32), max_num_reqs=32, max_num_batched_tokens=64,
                          decode_threshold=8, prefill_threshold=16)
ROWS = ((1.0, 2.0), (3.0, 4.0))
STATE = ((0.5, 0.5), (0.0, 0.0))  # one real slot, then the scratch slot
ROUTES = ((0, 0, 1), (1, 0, 0))
REFERENCE = ReferenceRows((ROWS, ROWS), (STATE, STATE), (ROUTES, ROUTES))


TIMEOUT = ErrorOrigin.TIMEOUT
NAMED = StepError("MicrobatchFailed", "Microbatch 0 of 2 failed", "InjectedFault: boom",
                  ErrorOrigin.INJECTED)

def records(tokens=(20, 24)) -> list[StepRecord]:
    plans = plan_without_world(CONFIG, [RankBatch.uniform(n, 1) for n in tokens])
    return [StepRecord(rank=p.rank, step=0, plan=p, executed="replay",
                       captured_split=((0, 16, 0, 16), (16, 32, 16, 32)),
                       replay_split=((0, 16, 0, 16), (16, 32, 16, 32)),
                       fingerprint=(("all_reduce", (7, 2), "int32"),
                                    ("all_to_all", (258, 19), "float64")),
                       routes=ROUTES, outputs=ROWS, state=STATE, threads_alive=(),
                       pending_run=False, error=None, injected_fault=False, seconds=0.01,
                       replayed=p.desc.label())
            for p in plans]


def test_clean_records_pass_every_step_checker():
    verdicts = check_step(records(), REFERENCE, deadline_s=5.0)
    assert all(v.ok for v in verdicts), [v for v in verdicts if not v.ok]


def test_a_rank_that_never_returned_or_took_too_long_fails_liveness():
    recs = records()
    assert check_liveness([recs[0], None], 5.0).detail.startswith("ranks [1] still running")
    slow = [recs[0], replace(recs[1], seconds=9.0)]
    assert "rank 1 took 9.00 s" in check_liveness(slow, 5.0).detail


def test_an_unexplained_error_fails_and_a_timed_out_peer_of_a_fault_passes():
    recs = records()
    err = StepError("CollectiveTimeout", "all_to_all did not complete", None, TIMEOUT)
    assert not check_errors([recs[0], replace(recs[1], error=err)]).ok
    faulted = [replace(recs[0], error=NAMED, injected_fault=True), replace(recs[1], error=err)]
    assert check_errors(faulted).ok
    hang = StepError("MicrobatchHang", "HANG", "InjectedFault: boom", ErrorOrigin.HANG)
    assert not check_errors([replace(recs[0], error=hang, injected_fault=True), recs[1]]).ok


def test_errors_says_contained_only_where_a_fault_was_injected():
    recs = records()
    timed_out = replace(recs[0], error=StepError("CollectiveTimeout", "", None, TIMEOUT))
    waited = check_errors([timed_out, None])  # rank 1 went silent; nothing was injected
    assert waited.ok and "injected fault contained" not in waited.detail
    assert waited.detail == ("no rank reports an injected fault; ranks [1] never reported "
                             "(liveness judges them), and the others only waited on them: "
                             "rank 0 CollectiveTimeout")
    faulted = check_errors([replace(recs[0], error=NAMED, injected_fault=True), None])
    assert faulted.detail == f"injected fault contained: rank 0 {NAMED.kind}"
    assert check_errors(recs).detail == ""  # nothing failed, nothing to contain


def test_a_fault_is_named_only_by_the_fault_or_the_microbatch_it_broke():
    recs = records()
    peer = replace(recs[1], error=StepError("CollectiveTimeout", "", None, TIMEOUT))
    # Caused by the fault, but reported as a protocol slip: the microbatch is not named.
    slip = StepError("ProtocolError", "yield outside a run", "InjectedFault: boom",
                     ErrorOrigin.INJECTED)
    assert not check_errors([replace(recs[0], error=slip, injected_fault=True), peer]).ok
    # Named like the runner's report, but the system raised it of its own accord.
    own = replace(NAMED, origin=ErrorOrigin.RAISED)
    assert not check_errors([replace(recs[0], error=own, injected_fault=True), peer]).ok
    killed = StepError("RankKilled", "was killed", None, ErrorOrigin.KILLED)
    lost = replace(recs[1], error=StepError("RankLost", "lost", None, ErrorOrigin.LOST))
    assert check_errors([replace(recs[0], error=killed, injected_fault=True), lost]).ok
    # Only the last of three ranks is a peer that failed on its own.
    own_peer = replace(recs[1], rank=2, error=StepError("ValueError", "bad", None))
    assert not check_errors([replace(recs[0], error=NAMED, injected_fault=True), peer,
                             own_peer]).ok


def test_only_a_hang_fails_liveness_not_a_timed_out_collective():
    recs = records()
    hang = StepError("MicrobatchHang", "never got the turn back", None, ErrorOrigin.HANG)
    timeout = StepError("CollectiveTimeout", "all_to_all", None, TIMEOUT)
    assert check_liveness([recs[0], replace(recs[1], error=timeout)], 5.0).ok
    three = [*recs, replace(recs[1], rank=2, error=hang)]
    assert check_liveness(three, 5.0).detail.startswith("rank 2 hung")


def test_a_peer_whose_gpu_stays_held_by_the_faulty_ranks_collective_passes_only_then():
    recs = records()
    wedged = StepError("DeviceWedged", "rank 1 step 0: the GPU work did not finish", None,
                       TIMEOUT)
    faulted = [replace(recs[0], error=NAMED, injected_fault=True), replace(recs[1], error=wedged)]
    assert check_errors(faulted).ok
    # Without an injected fault a wedged device is a finding, on whichever rank.
    assert not check_errors([recs[0], replace(recs[1], error=wedged)]).ok
    three = [*recs, replace(recs[1], rank=2, error=wedged)]  # only the last rank differs
    assert not check_errors(three).ok


def test_a_rank_issuing_another_collective_is_named_with_its_position():
    recs = records()
    other = replace(recs[1], fingerprint=(("all_reduce", (7, 2), "int32"),
                                          ("all_to_all", (130, 19), "float64")))
    verdict = check_fingerprints([recs[0], other])
    assert verdict.detail.startswith(
        "collective #1: rank 0 issues ('all_to_all', (258, 19), 'float64')")


def test_a_replay_split_that_differs_from_the_captured_one_is_named():
    recs = records()
    shifted = replace(recs[0], replay_split=((0, 16, 0, 16), (15, 32, 16, 32)))
    assert "rank 0 microbatch 1" in check_replay_split([shifted, recs[1]]).detail


def test_an_empty_region_in_a_microbatched_replay_fails():
    plans = plan_without_world(CONFIG.with_changes(guard="merged"),
                               [RankBatch.uniform(16, 1), RankBatch.uniform(32, 1)])
    recs = [replace(r, plan=p) for r, p in zip(records(), plans, strict=True)]
    assert "region(s) [1]" in check_no_empty_region(recs).detail


def test_a_wrong_row_a_wrong_state_slot_and_a_lost_route_are_each_named():
    recs = records()
    bad_row = replace(recs[1], outputs=((1.0, 2.0), (3.0, 4.5)))
    assert check_reference([recs[0], bad_row], REFERENCE).detail.startswith(
        "rank 1 output row 1")
    bad_state = replace(recs[0], state=((0.6, 0.5), (0.0, 0.0)))
    assert "state of request slot 0" in check_reference([bad_state, recs[1]], REFERENCE).detail
    # A scratch-slot difference is padding and must not count.
    scratch = replace(recs[0], state=((0.5, 0.5), (9.0, 9.0)))
    assert check_reference([scratch, recs[1]], REFERENCE).ok
    lost = replace(recs[0], routes=ROUTES[:1])
    assert check_routing([lost, recs[1]], REFERENCE).detail == "rank 0 never received (1, 0, 0)"


def test_a_live_thread_or_a_pending_run_after_a_step_fails_hygiene():
    recs = records()
    assert not check_thread_hygiene([replace(recs[0], threads_alive=("ubatch-1",)),
                                     recs[1]]).ok
    assert not check_thread_hygiene([recs[0], replace(recs[1], pending_run=True)]).ok
