"""`make bench`'s --exec vllm rows (harness/bench/exec_costs.py): bad counts and a directory
that holds no checkout are refused in one line naming the flag, and the fault-free rows run
the fault-free search's own draws, with vLLM executing and no fault left in."""

from __future__ import annotations

import pytest

from harness.bench import exec_costs, throughput


@pytest.mark.parametrize(("argv", "flag"), [(["--examples", "0"], "--examples"),
                                            (["--against", "/nonexistent"], "--against")])
def test_a_bad_flag_of_the_exec_rows_exits_2_naming_it(argv, flag, capsys):
    with pytest.raises(SystemExit) as stop:
        exec_costs.main(argv)
    assert stop.value.code == 2 and flag in capsys.readouterr().err


def test_make_bench_refuses_a_negative_count_of_exec_examples(capsys):
    with pytest.raises(SystemExit) as stop:
        throughput.main(["--exec-examples", "-1"])
    assert stop.value.code == 2 and "--exec-examples" in capsys.readouterr().err


def test_the_fault_free_rows_run_the_searchs_draws_on_vllms_execution_without_faults():
    pytest.importorskip("vllm")
    drawn = exec_costs.exec_examples(6)
    assert len(drawn) == 6 and len({s.config for s in drawn}) > 1
    assert all(s.config.system.execution.value == "vllm" and not s.faults for s in drawn)
    assert exec_costs.hang_example().faults  # the hang row's example does fault
