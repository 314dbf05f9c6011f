"""What the rest of the harness may ask of a world: run a scenario, say what graphs its
ranks capture with, and close, handing back any process that outlived it."""

from __future__ import annotations

from typing import Protocol

from harness.history.scenario_history import ScenarioHistory
from harness.scenario import Scenario
from harness.timeouts import Timeouts


class World(Protocol):
    nproc: int  # DP ranks
    timeouts: Timeouts  # the bounds its ranks run under (a caller may set new ones)
    graphs: str  # "emulated" or "cuda": the graph backend its ranks capture with

    def run(self, scenario: Scenario) -> ScenarioHistory:
        """Every rank's records of `scenario`; a failed or hung rank is a record, never a
        raise, and the world rebuilds itself before the next scenario."""

    def close(self) -> list[int]:
        """Stop every process of the world; the pids still alive after (must be empty)."""

    def __enter__(self) -> World: ...

    def __exit__(self, *exc_info: object) -> None: ...
