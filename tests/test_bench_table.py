"""The bench table's columns and its input: the ranks/driver/wire shares are what was
measured, and a bad batch size is one line and exit 2."""

import pytest

from harness.bench.throughput import Row, _shares, main, print_rows


def test_the_shares_split_the_wall_time_and_the_wire_takes_what_is_left():
    ranks, driver, wire = _shares(10.0, 6.0, 3.0)
    assert (round(ranks, 6), round(driver, 6), round(wire, 6)) == (0.6, 0.3, 0.1)
    # Pipelined, the driver overlaps the ranks: nothing is left for the wire, never less.
    assert _shares(10.0, 9.0, 3.0)[2] == 0.0


def test_the_table_prints_each_rows_shares_in_percent(capsys):
    floor = Row("floor", 100, 0.25)
    print_rows([Row("batched", 100, 0.5, "replay 100", (0.61, 0.27, 0.12)), floor], floor)
    lines = capsys.readouterr().out.splitlines()
    assert "ranks/driver/wire %" in lines[0]
    batched = next(line for line in lines if line.startswith("batched"))
    assert "61/27/12" in batched and "200.0" in batched  # examples/s
    assert next(line for line in lines if line.startswith("floor")).split()[6] == "-"


@pytest.mark.parametrize("size", ["0", "17"])
def test_a_batch_size_out_of_range_is_one_line_naming_the_flag_and_exit_2(capsys, size):
    with pytest.raises(SystemExit) as exit_info:
        main(["--batch", size])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--batch" in err[-1] and "Traceback" not in "\n".join(err)


def test_a_negative_seed_count_is_one_line_naming_the_flag_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--detection-seeds", "-1"])
    assert exit_info.value.code == 2
    assert "--detection-seeds" in capsys.readouterr().err.strip().splitlines()[-1]


def test_no_detection_seeds_skips_the_detection_table(monkeypatch, capsys):
    import harness.bench.throughput as bench

    monkeypatch.setattr(bench, "decode_examples", lambda n: [])
    monkeypatch.setattr(bench, "print_throughput", lambda *a: print("throughput"))
    monkeypatch.setattr(bench, "detection_rows", lambda *a: pytest.fail("detection ran"))
    monkeypatch.setattr(bench, "rebuild_rows", lambda *a, **k: pytest.fail("rebuilds ran"))
    monkeypatch.setattr(bench, "sandbox_rows", lambda *a, **k: pytest.fail("rebuilds ran"))
    assert main(["--detection-seeds", "0", "--dp4-examples", "0", "--rebuild-rounds", "0",
                 "--staging-draws", "0", "--reach-seconds", "0", "--exec-examples", "0",
                 "--schedule-examples", "0"]) == 0
    assert capsys.readouterr().out.strip() == "throughput"


def test_the_rebuild_rows_follow_the_throughput_table_with_their_medians(monkeypatch, capsys):
    import harness.bench.throughput as bench
    from harness.bench.rebuilds import RebuildRow

    monkeypatch.setattr(bench, "decode_examples", lambda n: [])
    monkeypatch.setattr(bench, "print_throughput", lambda *a: print("throughput"))
    asked = []

    def rows(backend, rounds):
        asked.append((backend, rounds))
        return [RebuildRow("soft rebuild (a fresh group, same processes)", backend,
                           (0.004, 0.006, 0.005))]

    monkeypatch.setattr(bench, "rebuild_rows", rows)
    monkeypatch.setattr(bench, "sandbox_rows", lambda rounds: [RebuildRow(
        "sandboxed sim world: a runner forked after an abort", "gloo", (0.2,) * rounds)])
    assert main(["--detection-seeds", "0", "--dp4-examples", "0", "--rebuild-rounds", "3",
                 "--staging-draws", "0", "--reach-seconds", "0", "--exec-examples", "0",
                 "--schedule-examples", "0"]) == 0
    out = capsys.readouterr().out
    assert asked == [("gloo", 3)]
    assert "sandboxed sim world: a runner forked after an abort" in out
    soft = next(line for line in out.splitlines() if line.startswith("soft rebuild"))
    assert soft.split()[-4:] == ["gloo", "3", "5", "6"]  # backend, n, median ms, worst ms


def test_a_negative_rebuild_count_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--rebuild-rounds", "-1"])
    assert exit_.value.code == 2
    assert "--rebuild-rounds: a count of failures, not -1" in capsys.readouterr().err
