"""`python -m harness decide` on skews worked out by hand, and its answers to bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import harness.cli as cli
from harness.cli import EXIT_BAD_INPUT, EXIT_CANNOT, EXIT_FOUND, EXIT_OK, main
from harness.errors import HarnessCannot

ROOT = Path(__file__).resolve().parents[1]
GRAPHS = ["--capture-sizes", "64,128", "--max-num-reqs", "256", "--prefill-threshold", "128"]


def decide_json(capsys, *flags: str) -> tuple[int, dict]:
    code = main(["decide", "--json", *flags])
    return code, json.loads(capsys.readouterr().out)


def real_tokens(rank: dict) -> list[int]:
    return [r["real_tokens"] for r in rank["regions"]]


def test_a_rank_at_half_the_graph_gets_an_eager_microbatched_step(capsys):
    code, out = decide_json(capsys, "--tokens", "64,128", *GRAPHS)
    assert code == EXIT_OK and out["agree"] is True
    r0, r1 = out["ranks"]
    assert (r0["cg_mode"], r0["num_ubatches"], r0["eager"], r0["num_tokens"]) == \
        ("NONE", 2, True, 128)
    assert r0["num_reqs"] == 64 and r1["num_reqs"] == 128  # eager: requests are not padded
    assert r0["regions"] == [{"tokens": 64, "real_tokens": 64}, {"tokens": 64, "real_tokens": 0}]
    assert real_tokens(r1) == [64, 64]


def test_the_merged_guard_replays_the_128_twin_with_an_empty_second_region(capsys):
    code, out = decide_json(capsys, "--tokens", "64,128", "--guard", "merged", *GRAPHS)
    assert code == EXIT_OK
    for rank in out["ranks"]:
        assert (rank["cg_mode"], rank["eager"], rank["num_tokens"], rank["num_reqs"]) == \
            ("FULL", False, 128, 128)
        assert rank["uniform_token_count"] == 1
    assert real_tokens(out["ranks"][0]) == [64, 0]


def test_a_three_way_split_with_the_literal_two_replays_an_empty_last_region(capsys):
    code, out = decide_json(capsys, "--tokens", "50,96", "--capture-sizes", "96",
                            "--num-ubatches", "3", "--decode-threshold", "3",
                            "--prefill-threshold", "3", "--max-num-reqs", "128",
                            "--guard", "strict-k2")
    assert code == EXIT_OK
    assert [r["cg_mode"] for r in out["ranks"]] == ["FULL", "FULL"]
    assert real_tokens(out["ranks"][0]) == [32, 18, 0]
    assert [r["tokens"] for r in out["ranks"][0]["regions"]] == [32, 32, 32]


def test_small_decodes_pad_to_the_next_graph_without_microbatching(capsys):
    code, out = decide_json(capsys, "--tokens", "10,20", "--capture-sizes", "16,32")
    assert code == EXIT_OK
    assert [(r["cg_mode"], r["num_tokens"], r["num_ubatches"], r["regions"])
            for r in out["ranks"]] == [("FULL", 32, 1, [])] * 2


def test_a_rank_that_disallows_microbatching_gets_everyone_a_plain_graph(capsys):
    code, out = decide_json(capsys, "--tokens", "64,64", "--no-ubatch-rank", "1", *GRAPHS)
    assert [(r["cg_mode"], r["num_ubatches"]) for r in out["ranks"]] == [("FULL", 1)] * 2


def test_a_mixed_rank_below_the_prefill_threshold_vetoes_microbatching(capsys):
    code, out = decide_json(capsys, "--tokens", "64,64", "--uct", "1,0", "--reqs", "64,16",
                            *GRAPHS)
    assert {r["num_ubatches"] for r in out["ranks"]} == {1}
    assert out["ranks"][0]["uniform_token_count"] is None


def test_three_ranks_are_decided_together(capsys):
    code, out = decide_json(capsys, "--tokens", "70,100,128", *GRAPHS)
    assert code == EXIT_OK and len(out["ranks"]) == 3
    assert {r["cg_mode"] for r in out["ranks"]} == {"FULL"}
    assert [real_tokens(r) for r in out["ranks"]] == [[64, 6], [64, 36], [64, 64]]


def test_asymmetric_candidates_are_reported_as_a_disagreement_with_exit_1(capsys):
    code, out = decide_json(capsys, "--tokens", "64,64", "--threshold-offset-rank", "1",
                            "--threshold-offset", "64", *GRAPHS)
    assert code == EXIT_FOUND
    assert out["agree"] is False
    assert out["disagreement"].startswith("cg_mode differs")


def test_a_config_file_sets_fields_and_flags_override_it(capsys, tmp_path):
    config = tmp_path / "dbo.toml"
    config.write_text('capture_sizes = [64, 128]\nmax_num_reqs = 256\nguard = "merged"\n'
                      'prefill_threshold = 128\n')
    code, out = decide_json(capsys, "--tokens", "64,128", "--config", str(config))
    assert out["ranks"][0]["cg_mode"] == "FULL"
    code, out = decide_json(capsys, "--tokens", "64,128", "--config", str(config),
                            "--guard", "fixed")
    assert out["ranks"][0]["cg_mode"] == "NONE"


def test_the_table_lists_every_rank_and_says_whether_they_agree(capsys):
    assert main(["decide", "--tokens", "64,128", *GRAPHS]) == EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["rank", "real", "decision"]
    assert out[1].split()[:3] == ["0", "64", "eager-microbatched"]
    assert "64/64 0/64" in out[1]
    assert out[-1] == "ranks agree"


@pytest.mark.parametrize("flags, field", [
    (["--tokens", "64,-1"], "tokens"),
    (["--tokens", "64,6x"], "tokens"),
    (["--tokens", "64"], "dp_size"),
    (["--tokens", "64,64", "--uct", "1"], "uct"),
    (["--tokens", "63,64", "--uct", "2,1"], "uct"),
    (["--tokens", "64,64", "--mode", "PIECEWISE"], "cudagraph_mode"),
    (["--tokens", "64,64", "--mode", "SOMETIMES"], "cudagraph_mode"),
    (["--tokens", "64,64", "--decode-threshold", "1"], "decode_threshold"),
    (["--tokens", "64,64", "--num-ubatches", "3", "--prefill-threshold", "2"],
     "prefill_threshold"),
    (["--tokens", "64,64", "--num-ubatches", "1"], "num_ubatches"),
    (["--tokens", "64,64", "--capture-sizes", ""], "capture_sizes"),
    (["--tokens", "64,64", "--capture-sizes", "0,64"], "capture_sizes"),
    (["--tokens", "64,64", "--capture-sizes", "64,1024"], "capture_sizes"),
    (["--tokens", "64,64", "--guard", "lenient"], "guard"),
    (["--tokens", "64,64", "--reqs", "65,64"], "reqs"),
    (["--tokens", "64,64", "--config", "/nonexistent/dbo.json"], "config"),
    (["--tokens", "64,64", "--no-ubatch-rank", "2"], "no_ubatch_rank"),
])
def test_bad_input_gets_one_line_naming_the_field_and_exit_2(capsys, flags, field):
    assert main(["decide", *flags]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"error: {field}:"), err[0]


def test_an_unknown_config_field_in_a_file_is_named(capsys, tmp_path):
    config = tmp_path / "dbo.json"
    config.write_text(json.dumps({"capture_sizes": [64], "graph_size": 3}))
    assert main(["decide", "--tokens", "64,64", "--config", str(config)]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err.strip() == "error: graph_size: is not a config field"


def test_the_module_entry_point_exits_2_without_a_traceback():
    proc = subprocess.run([sys.executable, "-m", "harness", "decide", "--tokens", "64,-5"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_BAD_INPUT
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == \
        "error: tokens: rank 1 has a negative token count -5"


def test_an_unknown_flag_is_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, "-m", "harness", "decide", "--tokens", "1,1",
                           "--bogus"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_BAD_INPUT
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == \
        ["error: unrecognized arguments: --bogus (see --help)"]


def failing_rank(monkeypatch, fail) -> None:
    """decide's rank code with rank 0 replaced by `fail()` (rank 1 then waits out its
    collective alone)."""
    decide_on_rank = cli.decide_on_rank

    def rank_code(group, config, rank, batch, timeout_s):
        if rank == 0:
            return fail()
        return decide_on_rank(group, config, rank, batch, timeout_s)

    monkeypatch.setattr(cli, "decide_on_rank", rank_code)


def raise_two_lines():
    raise ValueError("the split went wrong\nand this line is its detail")


def test_a_rank_that_raises_is_a_one_line_verdict_and_exit_1_not_a_traceback(capsys,
                                                                              monkeypatch):
    failing_rank(monkeypatch, raise_two_lines)
    code = main(["decide", "--tokens", "64,128", "--timeout", "0.5", *GRAPHS])
    out, err = capsys.readouterr()
    assert code == EXIT_FOUND, err
    assert out.splitlines() == ["RANKS FAILED: rank 0 failed: ValueError: the split went wrong "
                                "(ranks [0, 1] failed)"], out
    assert err == ""


def test_a_rank_that_raises_is_one_json_object_under_json(capsys, monkeypatch):
    failing_rank(monkeypatch, raise_two_lines)
    code, out = decide_json(capsys, "--tokens", "64,128", "--timeout", "0.5", *GRAPHS)
    assert code == EXIT_FOUND
    assert out["agree"] is False and out["ranks"] == []
    assert out["failed"].startswith("rank 0 failed: ValueError: the split went wrong")


def test_a_rank_that_hangs_is_a_one_line_verdict_and_exit_1(capsys, monkeypatch):
    released = threading.Event()
    failing_rank(monkeypatch, lambda: released.wait(60))
    try:
        code = main(["decide", "--tokens", "64,128", "--timeout", "0.5", *GRAPHS])
    finally:
        released.set()  # the abandoned rank thread ends with the test
    out, err = capsys.readouterr()
    assert code == EXIT_FOUND, err
    assert out.splitlines() == ["RANKS FAILED: ranks [0] did not finish within 6.0 s"], out
    assert "Traceback" not in err


def test_a_rank_that_raises_harness_cannot_is_exit_3_in_one_line(capsys, monkeypatch):
    def cannot():
        raise HarnessCannot("vllm", "vllm 9.9 has an API the harness does not know")

    failing_rank(monkeypatch, cannot)
    code = main(["decide", "--tokens", "64,128", "--timeout", "0.5", *GRAPHS])
    out, err = capsys.readouterr()
    assert code == EXIT_CANNOT, out
    assert err.splitlines() == ["error: vllm: vllm 9.9 has an API the harness does not know"]
    assert "RANKS FAILED" not in out
