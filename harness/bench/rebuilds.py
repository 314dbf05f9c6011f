"""`make bench`'s rebuild rows: what a world costs to come up and to come back after a
failure, by the world's own life-cycle clock (harness/world/lifecycle_clock.py).

- cold start: the first launch of a world (torchrun, every rank importing torch, the group);
- soft rebuild: a step fails and every rank survives, so the same processes form a fresh
  group (an injected exception in one microbatch, under the abortable protocol);
- hard rebuild: a rank is killed, so the world ends and relaunches, from a spare that booted
  while clean examples ran, or (spares 0) from nothing.
Between failures clean examples run for the longer of CLEAN_BETWEEN_S and twice the cold
start, so that a spare has booted; failures back to back (a shrink) find it still booting.
Each hard rebuild is printed whole (end + relaunch) and in its two parts. The sandboxed sim
world (the default) has rows of its own: its first runner forked from the zygote (started
before it), and one forked anew after a rank aborted; the thread ranks' gloo group forms in
the runner's first scenario, not here.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from harness.check.judge import judge
from harness.fuzz.engine import FUZZ_TIMEOUTS  # a search's bounds: hangs cost seconds
from harness.history.scenario_history import step_failed
from harness.scenario import Scenario, scenario_from_dict
from harness.world.sandbox.world import SandboxedSimWorld
from harness.world.torchrun.world import TorchrunWorld

CONFIG = {"capture_sizes": [16, 32], "max_num_reqs": 32, "max_num_batched_tokens": 32,
          "decode_threshold": 2, "prefill_threshold": 16, "cudagraph_mode": "NONE"}
CLEAN_BETWEEN_S = 3.0  # clean examples between two failures, for this long


@dataclass(frozen=True)
class RebuildRow:
    what: str
    backend: str
    samples: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return 1000 * statistics.median(self.samples) if self.samples else float("nan")

    @property
    def worst_ms(self) -> float:
        return 1000 * max(self.samples) if self.samples else float("nan")


def _scenario(name: str, faults: list[dict], nproc: int) -> Scenario:
    return scenario_from_dict({"name": name, "config": dict(CONFIG, dp_size=nproc),
                               "steps": [{"ranks": [12] * nproc}], "faults": faults})


def _fail_and_recover(world: TorchrunWorld, failing: Scenario, clean: Scenario,
                      rounds: int) -> None:
    between = max(CLEAN_BETWEEN_S, 2 * world.clock.starts[0])
    for _ in range(rounds):
        history = world.run(failing)
        assert any(step_failed(step) for step in history.steps), "the fault failed no step"
        until = time.monotonic() + between
        while time.monotonic() < until:
            assert judge(world.run(clean)).ok, "a clean example failed after a rebuild"


def rebuild_rows(backend: str = "gloo", nproc: int = 2, rounds: int = 5,
                 device: str | None = None) -> list[RebuildRow]:
    clean = _scenario("clean", [], nproc)
    soft = _scenario("raise", [{"kind": "raise_in_ubatch", "rank": 0, "step": 0}], nproc)
    killed = _scenario("kill", [{"kind": "kill_rank", "rank": nproc - 1, "step": 0}], nproc)
    rows = []
    with TorchrunWorld(nproc, backend, FUZZ_TIMEOUTS, device, spares=1) as world:
        world.run(clean)
        rows.append(RebuildRow("cold start (launch, imports, group)", backend,
                               tuple(world.clock.starts)))
        _fail_and_recover(world, soft, clean, rounds)
        if world.clock.regroups:
            rows.append(RebuildRow("soft rebuild (a fresh group, same processes)", backend,
                                   tuple(world.clock.regroups)))
        ends = len(world.clock.ends)
        _fail_and_recover(world, killed, clean, rounds)
        rows += _hard_rows("hard rebuild, from a spare", world, ends)
    with TorchrunWorld(nproc, backend, FUZZ_TIMEOUTS, device, spares=0) as world:
        world.run(clean)
        _fail_and_recover(world, killed, clean, rounds)
        rows += _hard_rows("hard rebuild, no spare", world, 0)
    return rows


def sandbox_rows(nproc: int = 2, rounds: int = 5) -> list[RebuildRow]:
    clean = _scenario("clean", [], nproc)
    aborted = _scenario("abort", [{"kind": "abort_rank", "rank": nproc - 1, "step": 0}], nproc)
    with SandboxedSimWorld(nproc, FUZZ_TIMEOUTS) as world:
        world.run(clean)
        for _ in range(rounds):
            history = world.run(aborted)
            assert any(step_failed(step) for step in history.steps), "the abort failed no step"
            assert judge(world.run(clean)).ok, "a clean example failed after a fresh runner"
        first, again = world.clock.starts[0], world.clock.relaunches
    return [RebuildRow("sandboxed sim world: first runner, forked", "gloo", (first,)),
            RebuildRow("sandboxed sim world: a runner forked after an abort", "gloo",
                       tuple(again))]


def _hard_rows(what: str, world: TorchrunWorld, skip: int) -> list[RebuildRow]:
    """End plus relaunch of each hard rebuild after the first `skip` ends, then each part."""
    ends = tuple(world.clock.ends[skip:])
    starts = tuple(world.clock.relaunches[-len(ends):]) if ends else ()
    whole = tuple(e + s for e, s in zip(ends, starts, strict=True))
    return [RebuildRow(f"{what} (end + relaunch)", world.backend, whole),
            RebuildRow("  of which the end (stop, kill, reap)", world.backend, ends),
            RebuildRow("  of which the relaunch", world.backend, starts)]


def print_rebuilds(rows: list[RebuildRow]) -> None:
    print(f"\n{'rebuild':52} {'backend':>7} {'n':>3} {'median ms':>10} {'worst ms':>9}")
    for row in rows:
        print(f"{row.what:52} {row.backend:>7} {len(row.samples):>3} {row.median_ms:10.0f} "
              f"{row.worst_ms:9.0f}")
