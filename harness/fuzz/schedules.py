"""The schedule as part of a fuzzed example (docs/schedules.md, "Scenarios, run and fuzz").

Under a controlled `--schedule` every drawn scenario carries one: its seed is drawn by
Hypothesis after the scenario (unless `--schedule-seed` pins it), so a failure shrinks toward
smaller seeds, and under `exhaustive` toward fewer preemptions (its seed numbers the bounded
schedules, fewest preemptions first: harness/runtime/schedule/bounded.py). The saved scenario
carries the schedule, so `run --scenario` replays the same interleavings.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import strategies as st

from harness.cli_schedule import schedule_from_args
from harness.runtime.schedule.bounded import schedules_within
from harness.runtime.schedule.descriptor import Schedule
from harness.scenario import Scenario

SEEDS = 2**16  # random and pct seeds drawn from 0 to SEEDS - 1


@dataclass(frozen=True)
class ScheduleSpace:
    schedule: Schedule  # the mode and bounds the user chose (its seed, when pinned)
    draws_seed: bool  # Hypothesis draws the seed per example

    @property
    def controlled(self) -> bool:
        return self.schedule.controlled


def space_from_args(args: argparse.Namespace) -> ScheduleSpace:
    return ScheduleSpace(schedule_from_args(args), args.schedule_seed is None)


def schedules(space: ScheduleSpace) -> st.SearchStrategy[Schedule]:
    base = space.schedule
    if not base.controlled or not space.draws_seed:
        return st.just(base)
    count = (schedules_within(base.preemptions, base.steps) if base.mode == "exhaustive"
             else SEEDS)
    return st.integers(0, count - 1).map(lambda seed: replace(base, seed=seed))


def scheduled(scenarios: st.SearchStrategy[Scenario],
              space: ScheduleSpace | None) -> st.SearchStrategy[Scenario]:
    """Each drawn scenario with a schedule of `space` (unchanged under `os`)."""
    if space is None or not space.controlled:
        return scenarios
    return st.tuples(scenarios, schedules(space)).map(
        lambda pair: replace(pair[0], schedule=pair[1]))


def keyed_fields(fixed: Mapping[str, Any], space: ScheduleSpace | None) -> dict[str, Any]:
    """The fields a search's database key is made of: a controlled schedule keeps its
    failures apart from the operating system's."""
    if space is None or not space.controlled:
        return dict(fixed)
    seed = "drawn" if space.draws_seed else space.schedule.seed
    return {**fixed, "schedule": (space.schedule.mode, seed, space.schedule.preemptions)}
