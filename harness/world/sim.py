"""The in-process world: N ranks as threads, each with a real gloo group, running the rank
code of `harness.sut.rank_runtime` on a scenario; the driver judges the records.

A scenario stops at the first step with a failed or hung rank: after a collective timed out
its gloo pairs are closed, so later steps would only report the same failure again.
"""

from __future__ import annotations

from harness.check.checkers import check_startup
from harness.errors import ConfigError
from harness.scenario import FaultKind, Scenario
from harness.sut.rank_runtime import RankRuntime
from harness.world.results import (
    DEFAULT_TIMEOUTS,
    ScenarioResult,
    Timeouts,
    judge,
    startup_lets_steps_run,
    step_failed,
)
from harness.world.threads import ThreadWorld


def run_scenario(scenario: Scenario, timeouts: Timeouts = DEFAULT_TIMEOUTS) -> ScenarioResult:
    killed = [i for i, f in enumerate(scenario.faults) if f.kind is FaultKind.KILL_RANK]
    if killed:
        raise ConfigError(f"faults[{killed[0]}].kind", "kill_rank needs the torchrun world "
                          "(the sim world's ranks are threads of one process)")
    config = scenario.config
    requests = scenario.requests()
    steps = []
    with ThreadWorld(config.dp_size, timeout_s=timeouts.collective_s) as world:
        runtimes = world.run(lambda rank, group: RankRuntime(
            config, rank, group, collective_timeout_s=timeouts.collective_s,
            hang_timeout_s=timeouts.hang_s))
        startup, _ = world.run_bounded(lambda rank, _g: runtimes[rank].startup(),
                                       timeouts.startup_deadline_s)
        if startup_lets_steps_run(check_startup(startup, timeouts.startup_deadline_s)):
            for i, ranks in enumerate(scenario.steps):
                records, _ = world.run_bounded(
                    lambda rank, _g, i=i, ranks=ranks: runtimes[rank].step(
                        i, requests[i][rank], ranks[rank], scenario.faults_at(i, rank)),
                    timeouts.step_deadline_s + 5.0)
                steps.append(records)
                if step_failed(records):
                    break
    return judge(scenario, startup, steps, timeouts)


class SimWorld:
    """The in-process world behind the same interface as the torchrun world."""

    def __init__(self, nproc: int, timeouts: Timeouts = DEFAULT_TIMEOUTS) -> None:
        self.nproc = nproc
        self.timeouts = timeouts

    def run(self, scenario: Scenario) -> ScenarioResult:
        if scenario.config.dp_size != self.nproc:
            raise ConfigError("dp_size", f"the scenario has {scenario.config.dp_size} ranks "
                              f"but this world has {self.nproc}")
        return run_scenario(scenario, self.timeouts)

    def close(self) -> list[int]:
        return []
