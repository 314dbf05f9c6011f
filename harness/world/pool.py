"""Worlds by DP size, opened on first use: a fuzzer that draws the DP size runs each
scenario on a world of its width, and every world is closed at the end."""

from __future__ import annotations

from harness.errors import ConfigError
from harness.history.scenario_history import ScenarioHistory
from harness.scenario import Scenario
from harness.timeouts import Timeouts
from harness.world import World, open_world, world_for


class WorldPool:
    def __init__(self, kind: str, backend: str, timeouts: Timeouts,
                 nproc: int | None = None, device: str | None = None,
                 preload_vllm: bool = False) -> None:
        if kind != "sim" and nproc is None:
            raise ConfigError("nproc", f"the {kind} world is one job of a fixed size: give "
                              "--nproc")
        self.kind = kind
        self.backend = backend
        self.device = device
        self.timeouts = timeouts
        self.preload_vllm = preload_vllm
        self.nproc = nproc
        self._worlds: dict[tuple[str, int], World] = {}
        if nproc is not None:
            # Bad input (backend, GPU count) is reported before any search.
            self._open(self.kind, nproc)

    def run(self, scenario: Scenario) -> ScenarioHistory:
        dp = scenario.config.serving.dp_size
        kind = world_for(self.kind, scenario.config)
        world = self._worlds.get((kind, dp)) or self._open(kind, dp)
        return world.run(scenario)

    def _open(self, kind: str, dp: int) -> World:
        world = open_world(kind, dp, self.backend, self.timeouts, self.device,
                           preload_vllm=self.preload_vllm)
        self._worlds[(kind, dp)] = world
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
