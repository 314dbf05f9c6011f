"""The in-process world running whole steps: capture, replay, eager microbatched and plain
steps against the reference, and every regression scenario caught by its checker."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from harness.check.judge import judge
from harness.cli import EXIT_BAD_INPUT, EXIT_FOUND, EXIT_OK, main
from harness.errors import ConfigError
from harness.scenario import load_scenario, scenario_from_dict
from harness.timeouts import Timeouts
from harness.world.pool import WorldPool
from harness.world.sim.world import SimWorld

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
FAST = Timeouts(collective_s=2.0, hang_s=4.0, step_deadline_s=15.0)
SMALL = {"capture_sizes": [16, 32], "max_num_reqs": 32, "max_num_batched_tokens": 64,
         "decode_threshold": 8, "prefill_threshold": 16}


def run_scenario(scenario, timeouts):
    """`scenario` judged on a fresh sim world of its own."""
    with SimWorld(scenario.config.serving.dp_size, timeouts) as world:
        return judge(world.run(scenario))


def run(config: dict, steps: list, faults: list | None = None):
    scenario = scenario_from_dict({"config": config, "steps": [{"ranks": r} for r in steps],
                                   "faults": faults or []})
    return run_scenario(scenario, FAST)


def failed(result) -> list[str]:
    return [v.checker for _, v in result.failed_verdicts()]


def executed(result) -> list[set[str]]:
    return [{r.executed for r in step.records} for step in result.steps]


@pytest.mark.parametrize("ranks", [2, 3])
def test_every_kind_of_step_matches_the_reference_on_real_rows_and_state(ranks):
    def decode(*tokens):
        return [{"tokens": n} for n in tokens[:ranks]]

    steps = [
        decode(20, 24, 30),  # a FULL microbatched replay of the 32 twin
        decode(3, 5, 7),  # below the decode threshold: a plain FULL replay of the 16 graph
        decode(10, 32, 17),  # 10 cannot reach the last region of 32: eager microbatched
        [{"query_lens": [3, 5, 2]}, {"query_lens": [7]}, {"query_lens": [1, 9]}][:ranks],
        decode(0, 5, 1),  # an idle rank: its dummy batch votes FULL, everyone replays 16
        [{"query_lens": [20, 20]}, {"query_lens": [6, 6]}, {"query_lens": [9]}][:ranks],
    ]  # the last one: above every graph for rank 0, so everyone runs plain eager
    result = run(SMALL, steps)
    assert result.ok, result.failed_verdicts()
    assert executed(result) == [{"replay"}, {"replay"}, {"eager-microbatched"}, {"replay"},
                                {"replay"}, {"eager"}]
    kinds = [{r.plan.kind for r in step.records} for step in result.steps]
    assert kinds[:4] == [{"full-microbatched"}, {"full"}, {"eager-microbatched"}, {"full"}]


def test_a_three_way_split_replays_and_runs_eager_like_the_reference():
    config = dict(SMALL, num_ubatches=3, capture_sizes=[24], decode_threshold=3,
                  prefill_threshold=3)
    result = run(config, [[{"tokens": 20}, {"tokens": 24}], [{"tokens": 15}, {"tokens": 24}],
                          [{"query_lens": [4, 4, 9]}, {"query_lens": [20, 10]}]])
    assert result.ok, result.failed_verdicts()
    assert executed(result) == [{"replay"}, {"eager-microbatched"}, {"eager-microbatched"}]


def test_the_high_throughput_backend_matches_the_reference_without_graphs():
    config = dict(SMALL, cudagraph_mode="NONE", all2all_backend="deepep_high_throughput")
    result = run(config, [[{"tokens": 20}, {"tokens": 24}], [{"query_lens": [9, 9]},
                                                            {"query_lens": [16, 4]}]])
    assert result.ok, result.failed_verdicts()
    assert executed(result) == [{"eager-microbatched"}, {"eager-microbatched"}]


def test_a_replayed_graph_reads_inputs_refreshed_in_place_across_steps():
    # The same graph serves three different batches; each must match the reference.
    result = run(SMALL, [[{"tokens": 20}, {"tokens": 24}], [{"tokens": 30}, {"tokens": 17}],
                         [{"tokens": 32}, {"tokens": 32}]])
    assert result.ok, result.failed_verdicts()
    assert executed(result) == [{"replay"}] * 3


def test_a_rank_whose_graph_replays_stale_outputs_is_named():
    result = run(dict(SMALL, capture_on="side"), [[{"tokens": 20}, {"tokens": 24}]])
    details = {v.checker: v.detail for _, v in result.failed_verdicts()}
    assert details["matches_reference"].startswith("rank 0 output row 0")
    assert "recorded nothing" in details["graphs_capture_work"]
    assert details["routing_provenance"].startswith("rank 0 never received")


def test_a_stock_sibling_failure_ends_as_a_reported_hang_within_the_deadline():
    config = dict(SMALL, protocol="stock", cudagraph_mode="NONE",
                  all2all_backend="deepep_high_throughput")
    start = time.monotonic()
    result = run(config, [[{"tokens": 20}, {"tokens": 24}], [{"tokens": 20}, {"tokens": 24}]],
                 [{"kind": "raise_in_ubatch", "rank": 0, "step": 0}])
    assert time.monotonic() - start < FAST.step_deadline_s
    verdict = next(v for _, v in result.failed_verdicts() if v.checker == "liveness")
    assert verdict.detail.startswith("rank 0 hung: MicrobatchHang")
    assert len(result.steps) == 1  # the world stops at the failed step
    assert all(not r.threads_alive for r in result.steps[0].records)


def test_the_abortable_protocol_names_the_failed_microbatch_and_leaves_no_thread():
    config = dict(SMALL, cudagraph_mode="NONE", all2all_backend="deepep_high_throughput")
    result = run(config, [[{"tokens": 20}, {"tokens": 24}]],
                 [{"kind": "raise_in_ubatch", "rank": 0, "step": 0}])
    assert result.ok, result.failed_verdicts()
    rank0 = result.steps[0].records[0]
    assert rank0.error.describe().startswith("MicrobatchFailed: Microbatch 0 of 2 failed")
    assert rank0.threads_alive == () and rank0.pending_run is False


@pytest.fixture(scope="module")
def sandboxed():
    """Sim worlds in their sandbox process: a scenario whose ranks abort must not end pytest."""
    with WorldPool("sim", "gloo", FAST) as pool:
        yield pool
        assert pool.close() == []


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.json")), ids=lambda p: p.stem)
def test_each_regression_scenario_is_caught_by_its_checker_and_clean_in_the_reference(
        sandboxed, path):
    scenario = load_scenario(path)
    assert scenario.caught_by and scenario.reference_changes
    buggy = judge(sandboxed.run(scenario))
    assert scenario.caught_by in [v.checker for _, v in buggy.failed_verdicts()]
    clean = judge(sandboxed.run(scenario.with_reference_behaviour()))
    assert clean.ok, clean.failed_verdicts()


def test_run_exits_0_when_every_checker_holds(capsys, tmp_path):
    path = tmp_path / "ok.json"
    path.write_text(json.dumps({"config": SMALL, "steps": [{"ranks": [20, 24]}]}))
    assert main(["run", "--scenario", str(path), "--json"]) == EXIT_OK
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True
    assert {v["checker"] for v in out["steps"][0]["verdicts"]} >= {
        "agreement", "collective_fingerprints", "matches_reference", "no_empty_region"}


def test_run_counts_each_checkers_coverage_and_never_counts_not_applicable_as_held(capsys,
                                                                                  tmp_path):
    path = tmp_path / "ok.json"
    path.write_text(json.dumps({"config": SMALL, "steps": [{"ranks": [20, 24]}]}))
    assert main(["run", "--scenario", str(path), "--json"]) == EXIT_OK
    out = json.loads(capsys.readouterr().out)
    verdicts = [*out["startup"], *out["steps"][0]["verdicts"], *out["scenario_verdicts"]]
    coverage = {c["checker"]: c for c in out["coverage"]}
    assert set(coverage) == {v["checker"] for v in verdicts}
    for v in verdicts:  # one verdict each: its outcome is its checker's one count
        counts = coverage[v["checker"]]
        held = v["outcome"] == "held"
        assert (counts["held"], counts["not_applicable"]) == (held, not held), v
        assert counts["judged"] == held and counts["failed"] == 0
    unjudged = sorted(c for c, n in coverage.items() if not n["judged"])
    assert "differential" in unjudged  # the harness decided: nothing to compare with
    assert main(["run", "--scenario", str(path)]) == EXIT_OK
    text = capsys.readouterr().out
    assert "all checkers hold" not in text
    assert text.splitlines()[-1] == (
        f"no checker failed: {len(verdicts) - len(unjudged)} verdicts held, {len(unjudged)} "
        "not applicable (nothing to judge)")
    assert f"  judged nothing: {', '.join(c for c in coverage if c in unjudged)}" in text
    row = next(line.split() for line in text.splitlines() if line.startswith("  differential "))
    assert row == ["differential", "0", "0", "0", "1"]


def test_run_exits_1_and_prints_the_scenario_back_when_a_checker_fails(capsys):
    assert main(["run", "--scenario", str(SCENARIOS / "guard-equality.json")]) == EXIT_FOUND
    out = capsys.readouterr().out
    assert "FAIL no_empty_region: rank 0 (16 real tokens)" in out
    printed = out[out.index("{"):]
    assert load_scenario_text(printed)["name"] == "guard-equality"


def load_scenario_text(text: str) -> dict:
    data = json.loads(text)
    scenario_from_dict(data)  # what is printed back must load again
    return data


@pytest.mark.parametrize("document, field", [
    ({"steps": []}, "steps"),
    ({"steps": [{"ranks": [{"tokens": -1}, {"tokens": 2}]}]}, "steps[0].ranks[0].tokens"),
    ({"steps": [{"ranks": [{"tokens": 1, "query_lens": [1]}, 2]}]}, "steps[0].ranks[0]"),
    ({"steps": [{"ranks": [1, 2]}, {"ranks": [1]}]}, "steps"),
    ({"steps": [{"ranks": [1, 2]}], "faults": [{"kind": "explode"}]}, "faults[0].kind"),
    ({"steps": [{"ranks": [1, 2]}], "faults": [{"kind": "raise_in_ubatch", "rank": 5}]},
     "faults[0].rank"),
    ({"steps": [{"ranks": [1, 2]}], "config": {"colour": 1}}, "colour"),
    ({"steps": [{"ranks": [1, 2]}], "expect": {"reference": {"guard": "lax"}}},
     "expect.reference.guard"),
    ({"steps": [{"ranks": [{"tokens": 300}, 2]}]}, "steps[0].tokens"),
])
def test_a_malformed_scenario_is_one_line_naming_the_field(document, field, capsys, tmp_path):
    with pytest.raises(ConfigError) as error:
        scenario_from_dict(document)
    assert error.value.field == field
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    assert main(["run", "--scenario", str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {field}:")


@pytest.mark.dist
def test_a_skewed_multi_step_scenario_holds_on_the_dp_world(nproc):
    ranks = [[{"tokens": n} for n in (20, 24, 30, 32)[:nproc]],
             [{"tokens": n} for n in (16, 32, 32, 32)[:nproc]],
             [{"query_lens": [2] * (i + 1)} for i in range(nproc)],
             [{"tokens": 0}] + [{"tokens": 9}] * (nproc - 1)]
    result = run(SMALL, ranks)
    assert result.ok, result.failed_verdicts()
    assert len(result.steps) == len(ranks)


def test_a_failed_capture_releases_its_parked_threads_and_leaves_no_pending_run():
    # Asymmetric tables: rank 1 captures other graphs, so a capture all-to-all times out.
    result = run_scenario(load_scenario(SCENARIOS / "asymmetric-candidates.json"), FAST)
    assert result.steps == ()
    errors = [r.error for r in result.startup if r.error is not None]
    assert errors and all("CollectiveTimeout" in e.describe() for e in errors)
    assert all(r.threads_alive == () and r.pending_run is False for r in result.startup)
    verdicts = {v.checker: v.ok for v in result.startup_verdicts}
    assert verdicts["capture_hygiene"] is True and verdicts["capture_symmetry"] is False
