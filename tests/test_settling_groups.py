"""Process groups a failed step left are let go only once quiet (harness/runtime/
settling_groups.py): destroying a gloo group while a collective of it is in flight blocks in
~ProcessGroupGloo holding the GIL, while the work's thread waits for the GIL (a CI hang)."""

from __future__ import annotations

import gc
import weakref

from harness.runtime.settling_groups import MAX_HELD, SETTLING, SettlingGroups
from harness.scenario import scenario_from_dict
from harness.timeouts import Timeouts
from harness.world.sim.world import QUIET_MARGIN_S, SimWorld


class Group:
    """Stands for a process group: weakly referenceable, so its end can be seen."""


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def held_for(settling: SettlingGroups, quiet_s: float) -> weakref.ref:
    group = Group()
    settling.hold([group], quiet_s)
    ref = weakref.ref(group)
    del group
    gc.collect()
    return ref


def test_a_held_group_lives_until_it_is_quiet_and_goes_at_the_next_release():
    clock = FakeClock()
    settling = SettlingGroups(clock, clock.sleep)
    ref = held_for(settling, 2.0)
    clock.now += 1.9
    settling.release_quiet()
    assert ref() is not None and settling.held == 1
    clock.now += 0.2
    settling.release_quiet()
    gc.collect()
    assert ref() is None and settling.held == 0


def test_a_group_with_nothing_to_settle_goes_at_once():
    clock = FakeClock()
    settling = SettlingGroups(clock, clock.sleep)
    ref = held_for(settling, 0.0)
    assert ref() is None and settling.held == 0 and not clock.slept


def test_past_the_most_held_a_hold_waits_for_the_first_to_go_quiet():
    clock = FakeClock()
    settling = SettlingGroups(clock, clock.sleep)
    refs = [held_for(settling, 5.0 + i) for i in range(MAX_HELD)]
    assert not clock.slept
    held_for(settling, 5.0)
    assert clock.slept == [5.0]  # until the first held went quiet, not the last
    gc.collect()
    assert refs[0]() is None and refs[1]() is not None and settling.held == MAX_HELD


def test_at_exit_every_held_group_is_waited_for_then_let_go():
    clock = FakeClock()
    settling = SettlingGroups(clock, clock.sleep)
    refs = [held_for(settling, s) for s in (1.0, 3.0)]
    settling.settle_all()
    gc.collect()
    assert clock.slept == [3.0] and all(r() is None for r in refs) and settling.held == 0


FAST = Timeouts(collective_s=1.0, hang_s=1.5, step_deadline_s=5.0)
# Rank 1 faults in its microbatch: the step fails with the other rank's waits in flight.
FAILING = scenario_from_dict({
    "name": "failing", "config": {"dp_size": 2, "cudagraph_mode": "NONE",
                                  "decode_threshold": 2, "prefill_threshold": 4},
    "steps": [{"ranks": [{"query_lens": [1] * 8}, {"query_lens": [1] * 6}]}],
    "faults": [{"kind": "raise_in_ubatch", "rank": 1, "step": 0, "ubatch": 0}]})


def test_the_sim_world_keeps_a_failed_steps_groups_until_its_waits_have_ended(monkeypatch):
    held: list[tuple[int, float]] = []
    monkeypatch.setattr(SETTLING, "hold", lambda groups, quiet_s: held.append(
        (len(groups), quiet_s)))
    with SimWorld(2, FAST) as world:
        history = world.run(FAILING)
        assert history.steps and any(r.error for r in history.steps[-1])
        assert held == [(2, FAST.hang_s + FAST.collective_s + QUIET_MARGIN_S)]
    assert held[1:] == [], "a world closed after the failure holds nothing more"
