"""The distributed suite's closing table of where its time went."""

from __future__ import annotations

from harness.report.suite_time import OTHER, add_clock, add_test, kind_of, time_table
from harness.world.lifecycle_clock import LifecycleClock

DETECTION = "tests/test_distributed_suite.py::test_the_fuzzer_finds_each_planted_bug_from_nothing_and_shrinks_it[guard-merged]"  # noqa: E501


def test_each_test_counts_under_what_it_is_for_and_the_rest_under_other():
    assert kind_of(DETECTION).startswith("detection searches")
    assert kind_of("tests/x.py::test_every_checker_holds_on_skewed_dp_steps[3]").startswith(
        "the Hypothesis pass")
    assert kind_of("tests/x.py::test_a_killed_rank_is_named") == OTHER


def test_every_phase_adds_its_seconds_but_only_the_call_counts_a_test():
    totals = {}
    for phase, seconds in (("setup", 2.0), ("call", 5.0), ("teardown", 1.0)):
        add_test(totals, DETECTION, phase, seconds)
    [(count, seconds)] = totals.values()
    assert (count, seconds) == (1, 8.0)


def test_the_worlds_clocks_sum_over_worlds_and_relaunches_are_the_starts_after_the_first():
    clock = LifecycleClock(starts=[2.0, 1.0, 0.5], regroups=[0.05], ends=[0.3, 0.4])
    totals = {}
    add_clock(totals, clock.totals())
    add_clock(totals, LifecycleClock(starts=[3.0]).totals())
    assert totals["cold start"] == [2, 5.0]
    assert totals["relaunch"] == [2, 1.5]
    assert totals["soft regroup"] == [1, 0.05]
    assert totals["end after a failure"][0] == 2


def test_shares_are_of_the_tests_seconds_summed_over_workers():
    tests = {OTHER: [3, 30.0]}
    add_test(tests, DETECTION, "call", 90.0)
    lines = time_table(tests, {}, wall_s=70.0, workers=2)
    detection = next(line for line in lines if line.startswith("detection"))
    assert detection.split()[-1] == "75%" and " 90.0 " in detection
    assert lines[-1].endswith("over 2 worker(s); wall time of the session: 70.0 s")
