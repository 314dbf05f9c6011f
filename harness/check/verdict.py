"""A checker's verdict: which invariant, whether it held, failed or did not apply to what
ran, and on failure where and why."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Outcome(Enum):
    HELD = "held"
    FAILED = "failed"
    # The step gave the checker nothing to judge (a rank never reported, a fault changed
    # what it guards by design): never counted as held.
    NOT_APPLICABLE = "not applicable"


@dataclass(frozen=True)
class Judgement:
    """What a checker function returns; the registry names it (harness/check/registry.py)."""

    outcome: Outcome
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome is not Outcome.FAILED


@dataclass(frozen=True)
class Verdict:
    checker: str
    outcome: Outcome
    detail: str = ""

    @property
    def ok(self) -> bool:
        """Not failed: a check that did not apply does not fail a run."""
        return self.outcome is not Outcome.FAILED

    @property
    def applied(self) -> bool:
        return self.outcome is not Outcome.NOT_APPLICABLE

    def to_dict(self) -> dict[str, object]:
        return {"checker": self.checker, "ok": self.ok, "outcome": self.outcome.value,
                "detail": self.detail}


def held(detail: str = "") -> Judgement:
    return Judgement(Outcome.HELD, detail)


def failed(detail: str) -> Judgement:
    return Judgement(Outcome.FAILED, detail)


def not_applicable(why: str) -> Judgement:
    return Judgement(Outcome.NOT_APPLICABLE, why)
