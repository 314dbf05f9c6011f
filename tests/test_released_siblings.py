"""A fix of #55586 that releases the surviving microbatches with an abort error of its own is
judged by what happened, not by the error's type (docs/spec.md §10.1): a sibling released
after the rank's first failure is a consequence, whichever of three ways the fix raises it;
one that dies of a programming error is a crash. Records are built as vLLM's runner and the
harness's trace leave them, from real exceptions (no vLLM needed)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from harness.check.checkers import check_errors
from harness.check.vllm_exec import microbatch_crash
from harness.faults import InjectedFault
from harness.history.records import StepRecord, UbatchError, VllmExecTrace
from harness.history.step_error import StepError, error_of
from harness.runtime.comm import CollectiveTimeout

WHERE = "/x/vllm/v1/worker/ubatching.py:120 (_wait_for_turn)"


class UbatchAborted(Exception):  # named as a fix would name it
    """Fix 1's own abort error: no RuntimeError, no harness origin, no cause."""


# Three fixes' ways of stopping a parked sibling once another microbatch failed (`first`).
def release_with_own_class(first: BaseException) -> None:
    raise UbatchAborted("microbatch 1 stopped: a sibling failed")


def release_chained(first: BaseException) -> None:
    raise RuntimeError("microbatch 1 released: its sibling failed") from first


def release_unchained(first: BaseException) -> None:
    raise RuntimeError("ubatch aborted")


FIXES = [release_with_own_class, release_chained, release_unchained]
Release = Callable[[BaseException], None]


def throw(exc: BaseException, cause: BaseException | None = None) -> None:
    raise exc from cause


def caught(raise_it: Callable[..., None], *args: object) -> tuple[BaseException, StepError]:
    """The exception `raise_it` raised, and what the harness records of it."""
    try:
        raise_it(*args)
    except Exception as exc:  # the error under test, whatever it is
        return exc, error_of(exc)
    raise AssertionError(f"{raise_it.__name__} raised nothing")


def fault() -> InjectedFault:
    return InjectedFault("injected failure in microbatch 0's dispatch")


def runner_report(first: BaseException) -> StepError:
    """What vLLM's UBatchRunner.finish raises for the step, from the first failure."""
    return caught(throw, RuntimeError("Microbatch 0 of 2 failed"), first)[1]


def rank(r: int, error: StepError | None, ubatch_errors: list[UbatchError], *,
         fault: bool = False) -> StepRecord:
    base = StepRecord.failed(r, 0, error or StepError("x", "x"), injected_fault=fault)
    trace = VllmExecTrace(tuple(ubatch_errors), (), ())
    return StepRecord(**{**base.__dict__, "error": error, "vllm_exec": trace})


def released_step(release: Release) -> list[StepRecord]:
    """Rank 0's microbatch 0 raises its fault in its forward, rank 1's times out waiting on
    it; on each rank the fix then releases microbatch 1."""
    records = []
    timeout = CollectiveTimeout("all_to_all did not complete")
    for r, first, where in ((0, fault(), "model.py:160 (_exchange)"), (1, timeout, "comm.py:40")):
        first_error = caught(throw, first)[1]
        sibling = caught(release, first)[1]
        records.append(rank(r, runner_report(first), [UbatchError(0, first_error, where),
                                                      UbatchError(1, sibling, WHERE)],
                            fault=r == 0))
    return records


@pytest.mark.parametrize("release", FIXES, ids=lambda f: f.__name__)
def test_a_sibling_a_fix_released_after_the_fault_is_a_consequence_on_every_rank(release):
    records = released_step(release)
    assert microbatch_crash(records) is None
    verdict = check_errors(records)
    assert verdict.ok, verdict.detail


@pytest.mark.parametrize("kind", [AttributeError, KeyError, TypeError, AssertionError])
@pytest.mark.parametrize("chained", [False, True], ids=["unchained", "chained-from-fault"])
def test_a_sibling_dying_of_a_programming_error_after_the_fault_is_a_crash(kind, chained):
    def misuse(first: BaseException) -> None:
        throw(kind("'NoneType' object has no attribute 'recv_hook'"), first if chained else None)

    verdict = check_errors(released_step(misuse))
    assert not verdict.ok
    assert verdict.detail.startswith(f"rank 0 microbatch 1 crashed: {kind.__name__}")
    assert verdict.detail.endswith(f"at {WHERE}")


def test_an_abort_recorded_before_any_failure_is_a_crash():
    # Microbatch 1 stopped of its own accord before microbatch 0's fault fired.
    first = fault()
    abort = caught(release_unchained, first)[1]
    records = [rank(0, runner_report(first), [UbatchError(1, abort, WHERE),
                                              UbatchError(0, caught(throw, first)[1], "m:1")],
                    fault=True)]
    assert microbatch_crash(records) == (f"rank 0 microbatch 1 crashed: RuntimeError: "
                                         f"ubatch aborted at {WHERE}")


@pytest.mark.parametrize("release", FIXES, ids=lambda f: f.__name__)
def test_a_fault_fired_outside_every_forward_precedes_the_siblings_it_released(release):
    # The faulty receive hook ran in microbatch 0's context exit: the trace holds only the
    # sibling the fix released; the runner's report carries the fault.
    first = fault()
    sibling = caught(release, first)[1]
    records = [rank(0, runner_report(first), [UbatchError(1, sibling, WHERE)], fault=True)]
    assert check_errors(records).ok


@pytest.mark.parametrize("release", [release_with_own_class, release_unchained],
                         ids=lambda f: f.__name__)
def test_an_unchained_abort_with_no_failure_before_it_is_a_crash(release):
    # No fault, no harness error on the rank: the abort is the rank's first failure.
    own = caught(release, RuntimeError("nothing failed"))
    records = [rank(0, runner_report(own[0]), [UbatchError(1, own[1], WHERE)])]
    assert microbatch_crash(records) == (f"rank 0 microbatch 1 crashed: {own[1].describe()} "
                                         f"at {WHERE}")


def test_a_first_failure_of_its_own_accord_is_named_and_its_released_sibling_is_not():
    own = RuntimeError("CUDA error: an illegal memory access was encountered")
    abort = caught(release_with_own_class, own)[1]
    records = [rank(0, runner_report(own), [UbatchError(0, caught(throw, own)[1], "m:9 (f)"),
                                            UbatchError(1, abort, WHERE)])]
    verdict = check_errors(records)
    assert not verdict.ok
    assert verdict.detail == ("rank 0 microbatch 0 crashed: RuntimeError: CUDA error: an "
                              "illegal memory access was encountered at m:9 (f)")


def peer_naming(ubatch: int, recorded: list[int]) -> StepRecord:
    """Rank 1: microbatch 1 times out, the fix releases microbatch 0 with a plain
    RuntimeError, and the runner reports microbatch `ubatch`; `recorded`: whose errors the
    trace kept."""
    timeout, timeout_error = caught(throw, CollectiveTimeout("all_to_all did not complete"))
    abort, abort_error = caught(release_unchained, timeout)
    errors = {1: UbatchError(1, timeout_error, "comm.py:40"), 0: UbatchError(0, abort_error, WHERE)}
    report = caught(throw, RuntimeError(f"Microbatch {ubatch} of 2 failed"),
                    abort if ubatch == 0 else timeout)[1]
    return rank(1, report, [errors[u] for u in recorded])


def test_a_peers_runner_naming_the_sibling_released_after_its_timeout_holds():
    faulted = released_step(release_chained)[0]
    verdict = check_errors([faulted, peer_naming(0, [1, 0])])
    assert verdict.ok, verdict.detail
    # A microbatch whose error no thread recorded failed outside the forward: a finding.
    verdict = check_errors([faulted, peer_naming(0, [1])])
    assert not verdict.ok
    assert verdict.detail.startswith("rank 1 (a peer of the faulty rank): RuntimeError: "
                                     "Microbatch 0 of 2 failed (caused by RuntimeError")


def test_a_faulted_rank_whose_runner_names_the_released_sibling_hides_the_fault():
    first = fault()
    fault_error, (abort, abort_error) = caught(throw, first)[1], caught(release_unchained, first)
    report = caught(throw, RuntimeError("Microbatch 1 of 2 failed"), abort)[1]
    records = [rank(0, report, [UbatchError(0, fault_error, "model.py:160 (_exchange)"),
                                UbatchError(1, abort_error, WHERE)], fault=True)]
    verdict = check_errors(records)
    assert not verdict.ok and verdict.detail.startswith("rank 0: the injected fault surfaced as")


def silent_fault_step(sibling_error: BaseException) -> list[StepRecord]:
    """Rank 0's microbatch 1 skipped its MoE layer (return_without_yielding raises nothing), so
    its microbatch 0 met an all-to-all rank 1 could not match; rank 1 timed out as well."""
    timeout = CollectiveTimeout("all_to_all did not complete")
    own = caught(throw, sibling_error)[1]
    peer = caught(throw, timeout)[1]
    return [rank(0, runner_report(sibling_error), [UbatchError(0, own, "comm.py:40")],
                 fault=True),
            rank(1, runner_report(timeout), [UbatchError(0, peer, "comm.py:40")])]


def test_a_silent_faults_only_trace_a_siblings_timeout_on_its_own_rank_is_contained():
    verdict = check_errors(silent_fault_step(CollectiveTimeout("all_to_all did not complete")))
    assert verdict.ok, verdict.detail


def test_on_the_faulty_rank_a_sibling_error_that_is_no_wait_still_fails():
    verdict = check_errors(silent_fault_step(RuntimeError("rows out of order")))
    assert not verdict.ok
    assert verdict.detail.startswith("rank 0 microbatch 0 crashed: RuntimeError"), verdict.detail


def test_a_timeout_on_the_faulty_rank_with_no_runner_report_of_it_still_fails():
    records = silent_fault_step(CollectiveTimeout("all_to_all did not complete"))
    unreported = caught(throw, CollectiveTimeout("all_to_all did not complete"))[1]
    records[0] = rank(0, unreported, [], fault=True)
    assert not check_errors(records).ok
