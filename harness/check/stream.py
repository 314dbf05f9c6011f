"""Judging a stream of histories as a world hands them back, while it runs the next ones.

A history from a batch ran with no go-ahead between steps; when it fails, the scenario runs
again alone and that run is what is reported, with its full records and evidence. If the
run alone passes, the batch's failure is kept all the same (a scenario that fails only
after others ran is a finding too), its evidence saying so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

from harness.check.judge import ScenarioResult, judge
from harness.history.scenario_history import ScenarioHistory
from harness.scenario import Scenario

PASSED_ALONE = ("failed in a batch, after the scenarios before it, but passed when run "
                "alone: the records above are the batch's")


def judge_stream(histories: Iterable[ScenarioHistory],
                 run_alone: Callable[[Scenario], ScenarioHistory]) -> Iterator[ScenarioResult]:
    """Every history's result; a batched one that fails is rerun alone once the stream
    ends (the world is not interleaved with a batch in flight), and reported from that run."""
    failed_in_batch: list[ScenarioResult] = []
    for history in histories:
        result = judge(history)
        if result.ok or not history.batched:
            yield result
        else:
            failed_in_batch.append(result)
    for batched in failed_in_batch:
        alone = judge(run_alone(batched.scenario))
        yield alone if not alone.ok else replace(batched, evidence=PASSED_ALONE)
