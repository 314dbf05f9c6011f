"""Searching schedules (docs/schedules.md): random and PCT find a handoff race planted in a
test-only protocol and their recorded choices replay it; exhaustive search visits exactly the
interleavings its preemption bound allows."""

from __future__ import annotations

import pytest

from harness.runtime.schedule import Schedule, explore, run_once


def _handoff(publish_first: bool):
    """A producer hands off to a consumer; the racy one wakes it before publishing."""
    def scenario(p):
        go, handed = p.event("go"), p.event("handed-off")
        box: dict[str, int] = {}
        seen: dict[str, int | None] = {}

        def producer():
            go.wait()
            if publish_first:
                box["result"] = 42
                handed.set()
            else:
                handed.set()  # the planted race: the consumer may run before the next line
                box["result"] = 42

        def consumer():
            handed.wait()
            seen["result"] = box.get("result")

        threads = [p.thread(producer, "producer"), p.thread(consumer, "consumer")]
        for t in threads:
            t.start()
        go.set()
        for t in threads:
            t.join()
        return seen["result"]

    return scenario


def _judge(result, error):
    if error is not None:
        return f"raised {error!r}"
    return None if result == 42 else f"the consumer read {result!r} before it was published"


@pytest.mark.parametrize("mode", ["random", "pct"])
def test_random_and_pct_find_the_planted_handoff_race_within_fifty_schedules(mode):
    found = explore(Schedule(mode, seed=0), _handoff(False), _judge, runs=50)
    assert not found.held
    assert "read None" in found.findings[0].verdict


@pytest.mark.parametrize("mode", ["random", "pct"])
def test_the_recorded_choices_of_the_race_replay_it_ten_times_of_ten(mode):
    finding = explore(Schedule(mode, seed=0), _handoff(False), _judge, runs=50).findings[0]
    recorded = finding.trace.schedule
    assert recorded.choices == finding.trace.choices
    for _ in range(10):
        trace, verdict = run_once(recorded, _handoff(False), _judge)
        assert verdict == finding.verdict
        assert trace.choices == recorded.choices


@pytest.mark.parametrize("mode", ["random", "pct"])
def test_the_same_seed_makes_the_same_choices_ten_times_of_ten(mode):
    first, _ = run_once(Schedule(mode, seed=4), _handoff(True), _judge)
    for _ in range(10):
        again, _ = run_once(Schedule(mode, seed=4), _handoff(True), _judge)
        assert again.choices == first.choices


def test_the_race_needs_one_preemption_so_exhaustive_finds_it_from_bound_one():
    assert explore(Schedule("exhaustive", preemptions=0), _handoff(False), _judge).held
    found = explore(Schedule("exhaustive", preemptions=1), _handoff(False), _judge)
    assert not found.held
    assert found.findings[0].trace.preemptions == 1


def test_exhaustive_search_of_the_fixed_handoff_holds_on_every_schedule():
    found = explore(Schedule("exhaustive", preemptions=3), _handoff(True), _judge,
                    runs=10_000)
    assert found.complete and found.held and found.visited > 1


def _two_logging_threads(p):
    log: list[str] = []

    def steps(name):
        for i in range(2):
            log.append(name)
            p.point(f"{name}{i}")

    threads = [p.thread(steps, name, (name,)) for name in "AB"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return "".join(log)


@pytest.mark.parametrize("bound, orders", [
    (0, {"AABB", "BBAA"}),
    (1, {"AABB", "BBAA", "ABBA", "BAAB"}),
    (2, {"AABB", "BBAA", "ABBA", "BAAB", "ABAB", "BABA"}),
])
def test_exhaustive_search_sees_exactly_the_interleavings_within_its_preemption_bound(
        bound, orders):
    seen: set[str] = set()

    def judge(result, error):
        seen.add(result)
        return None

    found = explore(Schedule("exhaustive", preemptions=bound), _two_logging_threads, judge,
                    runs=10_000, stop_at_first=False)
    assert found.complete
    assert seen == orders


def test_exhaustive_search_counts_the_same_schedules_on_every_run():
    counts = {explore(Schedule("exhaustive", preemptions=2), _two_logging_threads,
                      lambda result, error: None, runs=10_000).visited for _ in range(2)}
    assert len(counts) == 1 and counts.pop() > 6
