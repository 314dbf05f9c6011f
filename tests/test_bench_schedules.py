"""`make bench`'s schedule cost rows (harness/bench/schedules.py): every mode beside `os` on
both protocols, a row refusing to time a step that starts no thread or that was not
scheduled as named, vLLM's rows skipped with their reason where it does not import, and a bad
count one line naming the flag, exit 2."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from harness.bench import schedules, throughput
from harness.bench.schedules import ScheduleRow, modes, print_schedule_rows
from harness.runtime.schedule.bounded import schedules_within


def test_the_modes_are_os_first_then_random_pct_and_exhaustive_at_bounds_0_1_2():
    names = [name for name, _ in modes()]
    assert names == ["os", "random", "pct", "exhaustive p=0", "exhaustive p=1",
                     "exhaustive p=2"]
    schedule_of = dict(modes())
    assert not schedule_of["os"](3).controlled
    assert schedule_of["random"](3).seed != schedule_of["random"](4).seed
    bound1 = schedule_of["exhaustive p=1"]
    count = schedules_within(1, bound1(0).steps)
    assert [bound1(i).seed for i in (0, 1, count)] == [0, 1, 0]  # wraps over its numbering
    assert bound1(5).preemptions == 1


@pytest.mark.parametrize("executed, choices, name, wrong", [
    ("replay", None, "os", "not an eager microbatched step"),
    ("eager", (0, 1), "pct", "not an eager microbatched step"),
    ("eager-microbatched", None, "pct", "choices None"),
    ("eager-microbatched", (0, 1), "os", "choices (0, 1)"),
])
def test_a_row_refuses_a_step_it_would_time_under_the_wrong_name(executed, choices, name,
                                                                  wrong):
    record = SimpleNamespace(executed=executed, schedule_choices=choices, rank=0)
    with pytest.raises(RuntimeError, match=re.escape(wrong)):
        schedules._check_scheduled([record], name, 0)


def test_a_scheduled_eager_microbatched_step_passes_the_check():
    records = [SimpleNamespace(executed="eager-microbatched", schedule_choices=(1,), rank=r)
               for r in (0, 1)]
    schedules._check_scheduled(records, "random", 0)


def test_without_vllm_its_rows_are_skipped_with_the_reason_and_no_world_opens(monkeypatch):
    monkeypatch.setattr(schedules, "vllm_unavailable", lambda: "vllm does not import")
    rows = schedules.protocol_rows("vllm ubatching.py", 3)
    assert [r.mode for r in rows] == [name for name, _ in modes()]
    assert all(r.skipped == "vllm does not import" and r.examples == 0 for r in rows)


def test_the_table_prints_each_mode_beside_os_and_a_skipped_row_with_its_reason(capsys):
    print_schedule_rows([ScheduleRow("ring", "os", 10, 1.0, 5.0),
                         ScheduleRow("ring", "pct", 10, 2.0, 9.0),
                         ScheduleRow("vllm", "os", 0, 0.0, 0.0, "no vllm")])
    out = capsys.readouterr().out
    assert "ring" in out and "   2.00" in out  # pct at half os's examples/s: 2x slower
    assert "skipped: no vllm" in out


@pytest.mark.parametrize("entry", [schedules.main, throughput.main])
def test_a_bad_schedule_count_is_one_line_naming_the_flag_and_exit_2(capsys, entry):
    with pytest.raises(SystemExit) as exit_:
        entry(["--schedule-examples", "-1"])
    assert exit_.value.code == 2
    assert "--schedule-examples: a count of examples" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_miniature_rows_time_every_mode_on_a_torchrun_world():
    rows = schedules.protocol_rows("miniature ring", 2, rounds=1)
    assert [r.examples for r in rows] == [2] * len(modes())
    assert all(r.seconds > 0 and r.step_ms > 0 for r in rows)
