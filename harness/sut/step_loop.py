"""The one step loop of every world: a scenario's steps in order, each rank's step from the
previous step's state, until the caller says to stop (after a failed step, ranks stop)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from harness.batch import RankBatch
from harness.model.state import RequestSpec
from harness.scenario import Scenario

T = TypeVar("T")

# (step index, every rank's requests, what every rank is given) -> what the caller keeps
StepFn = Callable[[int, Sequence[Sequence[RequestSpec]], Sequence[RankBatch]], T]


def run_steps(scenario: Scenario, step: StepFn[T], go_on: Callable[[T], bool]) -> list[T]:
    """Run `step` for each step of `scenario`; stop after the first one `go_on` refuses."""
    requests = scenario.requests()
    done: list[T] = []
    for i, ranks in enumerate(scenario.steps):
        done.append(step(i, requests[i], ranks))
        if not go_on(done[-1]):
            break
    return done
