"""The bench's CPU column: every process of a row is counted, a lost one is an error rather
than a smaller sum, and the ceiling is the cores over the CPU per example."""

import subprocess
import sys

import psutil
import pytest

import harness.bench.cpu as cpu
from harness.bench.throughput import Row, print_rows

# Burns 0.4 s of CPU, says so, then waits to be killed (its CPU time stays readable).
BURN = ("import time, sys\n"
        "while time.process_time() < 0.4: pass\n"
        "print('done', flush=True); time.sleep(60)\n")


@pytest.fixture
def burners():
    procs = [subprocess.Popen([sys.executable, "-c", BURN], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "done"
        yield [proc.pid for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)


def test_cpu_seconds_sums_what_each_process_burned(burners):
    one = cpu.cpu_seconds(burners[:1])
    both = cpu.cpu_seconds(burners)
    # psutil reads clock ticks: allow a few of them below the 0.4 s each burned.
    assert 0.35 <= one < 2.0
    assert both >= 0.7 and both >= one + 0.35


def test_a_process_that_is_gone_is_an_error_not_a_smaller_sum():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    with pytest.raises(psutil.NoSuchProcess):
        cpu.cpu_seconds([proc.pid])


def test_the_table_prints_the_cpu_per_example_and_the_ceiling_of_the_cores(monkeypatch,
                                                                           capsys):
    monkeypatch.setattr(cpu, "cores", lambda: 2)
    floor = Row("floor", 100, 0.25, cpu_ms=4.0)
    print_rows([Row("batched", 100, 0.5, "replay 100", (0.6, 0.3, 0.1), cpu_ms=16.0),
                Row("sim", 100, 1.0), floor], floor)
    lines = capsys.readouterr().out.splitlines()
    assert "cpu ms" in lines[0] and "cpu cap/s" in lines[0]
    batched = next(line for line in lines if line.startswith("batched")).split()
    assert batched[6:9] == ["60/30/10", "16.00", "125.0"]  # 2 cores x 1000 / 16 ms
    assert next(line for line in lines if line.startswith("floor")).split()[7:9] == [
        "4.00", "500.0"]
    assert next(line for line in lines if line.startswith("sim")).split()[6:9] == ["-"] * 3
