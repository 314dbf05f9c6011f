"""Worlds by DP size, opened on first use: a fuzzer that draws the DP size runs each
scenario on a world of its width, and every world is closed at the end."""

from __future__ import annotations

from harness.errors import ConfigError
from harness.history.scenario_history import ScenarioHistory
from harness.scenario import Scenario
from harness.timeouts import Timeouts
from harness.world import open_world


class WorldPool:
    def __init__(self, kind: str, backend: str, timeouts: Timeouts,
                 nproc: int | None = None, device: str | None = None) -> None:
        if kind != "sim" and nproc is None:
            raise ConfigError("nproc", f"the {kind} world is one job of a fixed size: give "
                              "--nproc")
        self.kind = kind
        self.backend = backend
        self.device = device
        self.timeouts = timeouts
        self.nproc = nproc
        self._worlds: dict[int, object] = {}
        if nproc is not None:
            self._open(nproc)  # bad input (backend, GPU count) is reported before any search

    def run(self, scenario: Scenario) -> ScenarioHistory:
        dp = scenario.config.dp_size
        world = self._worlds.get(dp) or self._open(dp)
        return world.run(scenario)

    def _open(self, dp: int):
        world = open_world(self.kind, dp, self.backend, self.timeouts, self.device)
        self._worlds[dp] = world
        return world

    def close(self) -> list[int]:
        """Close every world; the pids that outlived them (must be empty)."""
        leftover: list[int] = []
        for world in self._worlds.values():
            leftover += world.close()
        self._worlds.clear()
        return leftover

    def __enter__(self) -> WorldPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
