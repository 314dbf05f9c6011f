"""What one judged run says to the search: the failing checker to report, and whether the
failure is nothing but a bound running out.

The fuzzer's bounds are short (a second per collective) so that a hang costs little. On a
loaded machine one can run out on a run that passes when rerun. Such a one-off does not end
the search (README, "The main flags"); it is the finding only when nothing that reproduces is
found.
"""

from __future__ import annotations

from collections.abc import Iterator

from harness.check.judge import ScenarioResult
from harness.errors import ErrorOrigin
from harness.fuzz.result import ExampleVerdict
from harness.history.step_error import StepError
from harness.invariants import CheckerName

RAN_OUT = frozenset({ErrorOrigin.TIMEOUT, ErrorOrigin.HANG})
# A microbatch released because its sibling's wait ran out fails as a consequence of it.
RELEASED = frozenset({ErrorOrigin.ABORTED})
# The checkers that judge errors and missing ranks (a wrong result is judged by others).
ERROR_CHECKERS = frozenset({CheckerName.STARTUP, CheckerName.ERRORS, CheckerName.LIVENESS})


def first_failure(result: ScenarioResult, preferred: tuple[str, ...] = (),
                  only: tuple[str, ...] | None = None) -> ExampleVerdict:
    """The failing checker to report: one the variant is known by, else the earliest.
    With `only`, failures of other checkers do not count (a hunt for one class)."""
    failed = [v for _, v in result.failed_verdicts() if only is None or v.checker in only]
    if not failed:
        return ExampleVerdict(True)
    by_name = {v.checker: v for v in reversed(failed)}
    chosen = next((by_name[c] for c in preferred if c in by_name), failed[0])
    return ExampleVerdict(False, chosen.checker, chosen.detail,
                          timed_out=only_bounds_ran_out(result, chosen.checker))


def only_bounds_ran_out(result: ScenarioResult, checker: str) -> bool:
    """The failing `checker` judges errors or missing ranks, and every error the run left is
    a bound that ran out (or a sibling released by one), at least one bound. (Checkers that
    compare ranks fail beside it as its consequence: a rank that timed out issued less.)"""
    if checker not in ERROR_CHECKERS:
        return False
    origins = {error.origin for error in _errors(result)}
    silent = any(rec is None for rec in result.startup) or any(
        rec is None for step in result.steps for rec in step.records)
    return bool(origins & RAN_OUT or silent) and origins <= RAN_OUT | RELEASED


def _errors(result: ScenarioResult) -> Iterator[StepError]:
    for startup in result.startup:
        if startup is not None and startup.error is not None:
            yield startup.error
    for step in result.steps:
        for rec in step.records:
            if rec is None:
                continue
            if rec.error is not None:
                yield rec.error
            if rec.vllm_exec is not None:
                yield from (u.error for u in rec.vllm_exec.ubatch_errors)
