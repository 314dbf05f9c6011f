"""The harness's microbatch ring under controlled schedules (harness/runtime/ubatching/proof.py,
docs/schedules.md): seeded schedules replay, exhaustive search of the abortable protocol holds
on every schedule of a step, fault-free and per fault stage, and the judge can fail."""

from __future__ import annotations

import pytest

from harness.runtime.schedule import Schedule, explore, run_once
from harness.runtime.ubatching import AbortableProtocol, protocols
from harness.runtime.ubatching.proof import STAGES, Step, judge_of, prove, scenario_of


@pytest.mark.parametrize("mode", ["random", "pct"])
def test_the_same_seed_replays_the_identical_ring_schedule_ten_times_of_ten(mode):
    step = Step(3)
    first, verdict = run_once(Schedule(mode, seed=11), scenario_of(step), judge_of(step))
    assert verdict is None and len(first.choices) > 10
    for _ in range(10):
        again, _ = run_once(Schedule(mode, seed=11), scenario_of(step), judge_of(step))
        assert again.choices == first.choices


def test_different_seeds_make_different_ring_schedules():
    step = Step(3)
    lists = {run_once(Schedule("random", seed=s), scenario_of(step), judge_of(step))[0].choices
             for s in range(5)}
    assert len(lists) > 1


@pytest.mark.parametrize("k, bound", [(2, 0), (2, 1), (2, 2), (3, 0)])
def test_every_schedule_of_a_fault_free_step_holds_and_the_count_is_stable(k, bound):
    runs = [prove(Step(k), Schedule("exhaustive", preemptions=bound)) for _ in range(2)]
    assert all(r.complete and r.held for r in runs)
    assert runs[0].visited == runs[1].visited > 1


@pytest.mark.slow
def test_every_schedule_of_a_fault_free_three_microbatch_step_with_one_preemption_holds():
    found = prove(Step(3), Schedule("exhaustive", preemptions=1))
    assert found.complete and found.held and found.visited > 1


def test_a_larger_preemption_bound_visits_more_schedules():
    counts = [prove(Step(2), Schedule("exhaustive", preemptions=b)).visited for b in (0, 1, 2)]
    assert counts[0] < counts[1] < counts[2]


@pytest.mark.parametrize("faulty", [0, 1])
@pytest.mark.parametrize("stage", [s for s in STAGES if s != "none"])
def test_every_schedule_of_each_fault_stage_holds_under_the_abortable_protocol(stage, faulty):
    found = prove(Step(2, stage=stage, faulty=faulty), Schedule("exhaustive", preemptions=1))
    assert found.complete and found.held and found.visited > 1


@pytest.mark.parametrize("stage", ["return_without_yielding", "raise_in_recv_hook"])
def test_the_stock_protocol_fails_the_same_judge_and_its_schedule_replays_the_failure(stage):
    step = Step(2, variant="stock", stage=stage)
    found = prove(step, Schedule("exhaustive", preemptions=1))
    assert not found.held
    finding = found.findings[0]
    assert "recv_hook" in finding.verdict or "MicrobatchFailed" in finding.verdict
    for _ in range(3):
        trace, verdict = run_once(finding.trace.schedule, scenario_of(step), judge_of(step))
        assert verdict == finding.verdict and trace.choices == finding.trace.choices


class _LateHooks(AbortableProtocol):
    """Test-only: receive hooks run only when their runner exits, after the data was read."""

    name = "late-hooks"

    def run_hooks(self, me) -> None:
        return None

    def settle_hooks_at_exit(self, me, error) -> None:
        AbortableProtocol.run_hooks(self, me)
        super().settle_hooks_at_exit(me, error)


class _DroppedHooks(AbortableProtocol):
    """Test-only: receive hooks are never run."""

    name = "dropped-hooks"

    def run_hooks(self, me) -> None:
        return None


@pytest.mark.parametrize("protocol, verdict", [
    (_LateHooks(), "data read before its receive completed"),
    (_DroppedHooks(), "receives completed []"),
])
def test_the_judge_catches_a_protocol_whose_receives_complete_late_or_never(
        monkeypatch, protocol, verdict):
    monkeypatch.setitem(protocols.PROTOCOLS, protocol.name, protocol)
    monkeypatch.setattr(protocols, "VARIANTS", (*protocols.VARIANTS, protocol.name))
    step = Step(2, variant=protocol.name)
    found = explore(Schedule("exhaustive", preemptions=0), scenario_of(step), judge_of(step))
    assert not found.held
    assert found.findings[0].verdict.startswith(verdict)
