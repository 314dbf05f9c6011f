"""Dead DP ranks across a scenario's steps (vLLM's fault tolerance, docs/spec.md §1.7).

A rank dies at some step and stays dead: from then on it is idle, and its column of the DP
sync reads zero on every rank. Each survivor is told of the death at a step of its own, at or
after it. The worlds keep the dead rank's process in their rings as a silent member (tearing
the communicators down is vLLM's recovery, outside the DBO path): it takes what the live
ranks know together as its own knowledge, so that its collectives follow theirs.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.batch import RankBatch
from harness.config import HarnessConfig
from harness.errors import ConfigError


def dead_at(step: Sequence[RankBatch]) -> frozenset[int]:
    """The ranks dead at this step."""
    return frozenset(r for r, b in enumerate(step) if b.dead)


def has_deaths(scenario) -> bool:
    """Whether some rank of the scenario (a Scenario) dies."""
    return any(dead_at(step) for step in scenario.steps)


def known_dead(step: Sequence[RankBatch]) -> frozenset[int]:
    """The dead ranks some live rank has been told of at this step."""
    return frozenset(d for b in step if not b.dead for d in b.knows_dead)


def check_deaths(config: HarnessConfig,
                 steps: Sequence[Sequence[RankBatch]]) -> None:
    """Refuse deaths no run of vLLM's fault tolerance has, naming the first field that shows
    it: without fault_tolerance, a rank that comes back or runs tokens, a survivor told of a
    rank that is alive or told of a death it then forgets, a step with no live rank."""
    for i, step in enumerate(steps):
        for j, batch in enumerate(step):
            where = f"steps[{i}].ranks[{j}]"
            if (batch.dead or batch.knows_dead) and not config.serving.fault_tolerance:
                field = "dead" if batch.dead else "knows_dead"
                raise ConfigError(f"{where}.{field}", "needs fault_tolerance (vLLM's "
                                  "enable_fault_tolerance)")
            _check_rank(steps, i, j, where)
        if len(dead_at(step)) == len(step):
            raise ConfigError(f"steps[{i}].ranks", "has no live rank: vLLM's fault tolerance "
                              "gives up when every DP rank is dead")


def _check_rank(steps: Sequence[Sequence[RankBatch]], i: int, j: int, where: str) -> None:
    batch, dead = steps[i][j], dead_at(steps[i])
    if batch.dead and batch.num_tokens:
        raise ConfigError(f"{where}.dead", f"a dead rank runs nothing, not {batch.num_tokens} "
                          "tokens")
    if i > 0 and steps[i - 1][j].dead and not batch.dead:
        raise ConfigError(f"{where}.dead", f"rank {j} died at an earlier step and stays dead")
    if batch.dead:
        return
    for d in batch.knows_dead:
        if d == j or d not in dead:
            raise ConfigError(f"{where}.knows_dead", f"names rank {d}, which is alive at "
                              "this step")
    if i > 0 and not steps[i - 1][j].dead:
        forgotten = set(steps[i - 1][j].knows_dead) - set(batch.knows_dead)
        if forgotten:
            raise ConfigError(f"{where}.knows_dead", f"forgets dead rank {min(forgotten)}, "
                              "told of at an earlier step")


def with_silent_members(step: Sequence[RankBatch]) -> tuple[RankBatch, ...]:
    """The step with each dead rank given what the live ranks know together (the module
    docstring: the silent member follows them)."""
    shared = sorted(known_dead(step))
    return tuple(b.with_deaths(shared, dead=True) if b.dead else b for b in step)


def steps_without_rank(config: HarnessConfig, steps: Sequence[Sequence[RankBatch]],
                 rank: int) -> tuple[tuple[RankBatch, ...], ...]:
    """`steps` with `rank` left out: what every rank was told renumbered, a death of `rank`
    forgotten; ConfigError where what is left is no fault-tolerant run (no live rank)."""
    def renumbered(batch: RankBatch) -> RankBatch:
        told = [d - (d > rank) for d in batch.knows_dead if d != rank]
        return batch if told == list(batch.knows_dead) else batch.with_deaths(told, batch.dead)

    fewer = tuple(with_silent_members([renumbered(b) for r, b in enumerate(step) if r != rank])
                  for step in steps)
    check_deaths(config, fewer)
    return fewer
