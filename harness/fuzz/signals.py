"""The signals that end or steer a search (harness/fuzz/engine.py): the BaseExceptions unwind
out of Hypothesis without being taken for failures to shrink; _CheckerFailed is the failure."""

from __future__ import annotations

from harness.errors import HarnessCannot
from harness.fuzz.result import ExampleVerdict
from harness.scenario import Scenario


class _BudgetSpent(BaseException):  # noqa: N818 - a control-flow signal, not an error
    """Ends the search. A BaseException so that Hypothesis does not take it for a failure
    to shrink; it unwinds straight out of the engine."""


class _SharedFailure(BaseException):  # noqa: N818 - a control-flow signal, not an error
    """Another process saved a failure under this search's key: restart the search, whose
    reuse phase then replays it before anything else."""


class _Intermittent(BaseException):  # noqa: N818 - a control-flow signal, not an error
    """The first failure passed on a rerun: the search ends with it, unshrunk (a shrink
    believes each candidate on one run, which an intermittent failure makes unreliable)."""

    def __init__(self, scenario: Scenario, verdict: ExampleVerdict) -> None:
        super().__init__(f"{verdict.checker}: {verdict.detail}")
        self.scenario, self.verdict = scenario, verdict


class _Cannot(BaseException):  # noqa: N818 - a control-flow signal, not an error
    """HarnessCannot running or judging an example: no failure to shrink; `fuzz` raises it."""

    def __init__(self, cannot: HarnessCannot) -> None:
        super().__init__(str(cannot))
        self.cannot = cannot


class _ShrinkCut(BaseException):  # noqa: N818 - a control-flow signal, not an error
    """Hypothesis's shrink reached its bound: it would only go on drawing candidates that are
    no longer run (seconds, even minutes). Its smallest failure so far stands, without the
    blob Hypothesis writes only for a shrink it finished."""


class _CheckerFailed(Exception):  # noqa: N818 - named for what Hypothesis reports
    def __init__(self, verdict: ExampleVerdict) -> None:
        super().__init__(f"{verdict.checker}: {verdict.detail}")
        self.verdict = verdict
