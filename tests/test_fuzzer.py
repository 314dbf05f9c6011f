"""The fuzzer's parts that need no world of their own: the last shrink pass, the choice of
the failing checker, the exhaustive cross-check, and `python -m harness fuzz` itself."""

from __future__ import annotations

import ast
import json

import pytest
from fuzz_crosscheck import cross_check
from hypothesis import HealthCheck, given, reproduce_failure, settings
from hypothesis import strategies as st

import harness.fuzz.engine as engine
import harness.fuzz.search_state as search_state
from harness.batch import RankBatch
from harness.check.coverage import coverage_of
from harness.check.judge import judge
from harness.cli import EXIT_BAD_INPUT, EXIT_FOUND, main
from harness.config import HarnessConfig
from harness.faults import Fault, FaultKind
from harness.fuzz.engine import FUZZ_TIMEOUTS, Budget, fuzz, scenario_strategy
from harness.fuzz.example_verdict import first_failure
from harness.fuzz.reduce import reduce_scenario, simpler_scenarios
from harness.fuzz.run_log import ExampleEntry, FindingEntry, read_log
from harness.fuzz.variants import variant_named
from harness.scenario import Scenario
from harness.world.sim.world import SimWorld

CONFIG = HarnessConfig.of(dp_size=4, capture_sizes=(8,), max_num_reqs=16,
                          max_num_batched_tokens=16, decode_threshold=2, prefill_threshold=4)


def four_rank_scenario() -> Scenario:
    step = tuple(RankBatch.from_query_lens((1,) * n) for n in (2, 8, 5, 8))
    other = tuple(RankBatch.from_query_lens((1,) * n) for n in (1, 1, 1, 1))
    return Scenario(CONFIG, (other, step), (Fault(FaultKind.RAISE_IN_UBATCH, 3, 1),))


def test_the_last_shrink_pass_drops_steps_and_ranks_while_the_failure_holds():
    # The "failure": some rank holds 2 tokens while another holds 8.
    def fails(s: Scenario) -> bool:
        return any({2, 8} <= {len(r.query_lens) for r in ranks} for ranks in s.steps)

    reduced = reduce_scenario(four_rank_scenario(), fails, dp_sizes=(2, 3, 4))
    assert reduced.config.serving.dp_size == 2 and len(reduced.steps) == 1
    assert sorted(len(r.query_lens) for r in reduced.steps[0]) == [2, 8]


def test_the_last_shrink_pass_keeps_the_width_of_a_world_that_has_only_one():
    tried = []

    def fails(s: Scenario) -> bool:
        tried.append(s.config.serving.dp_size)
        return True

    reduced = reduce_scenario(four_rank_scenario(), fails, dp_sizes=(4,))
    assert reduced.config.serving.dp_size == 4 and len(reduced.steps) == 1
    assert set(tried) == {4}
    # Three ranks are drawn, two are not: one rank fewer, and no more.
    assert reduce_scenario(four_rank_scenario(), fails, dp_sizes=(3, 4)).config.serving.dp_size == 3


def test_dropping_a_rank_renumbers_the_faults_of_the_ranks_after_it():
    smaller = four_rank_scenario().without_rank(1)
    assert smaller.config.serving.dp_size == 3
    assert [len(r.query_lens) for r in smaller.steps[1]] == [2, 5, 8]
    assert smaller.faults == (Fault(FaultKind.RAISE_IN_UBATCH, 2, 1),)
    assert four_rank_scenario().without_rank(3).faults == ()


def test_a_single_step_keeps_only_its_faults_and_two_ranks_are_the_floor():
    alone = four_rank_scenario().only_step(1)
    assert len(alone.steps) == 1 and alone.faults == (Fault(FaultKind.RAISE_IN_UBATCH, 3, 0),)
    two = Scenario(CONFIG.with_changes(dp_size=2), ((RankBatch.from_query_lens((1,)),) * 2,))
    assert list(simpler_scenarios(two, dp_sizes=(1, 2, 3))) == []


@pytest.mark.parametrize("changes, enumerated", [
    ({"guard": "merged"}, "no_empty_region"),
    ({"threshold_offset_rank": 1, "threshold_offset": 8}, "agreement"),
])
def test_no_failure_class_the_enumeration_finds_is_missed_by_the_fuzzer(changes, enumerated):
    config = HarnessConfig.of(dp_size=2, capture_sizes=(8, 16), max_num_reqs=16,
                              max_num_batched_tokens=16, decode_threshold=2, prefill_threshold=4,
                              **changes)
    with SimWorld(2, FUZZ_TIMEOUTS) as world:
        check = cross_check(config, world.run, world="sim", max_tokens=16,
                            budget=Budget(examples=200, seconds=None), seed=0)
    assert enumerated in check.enumerated
    assert check.missed == (), check.found


def fuzz_json(capsys, tmp_path, *flags: str) -> tuple[int, dict]:
    code = main(["fuzz", "--json", "--no-database", "--log", str(tmp_path / "log.jsonl"),
                 "--found-dir", str(tmp_path / "found"), *flags])
    return code, json.loads(capsys.readouterr().out.splitlines()[-1])


def test_fuzz_prints_the_shrunk_case_with_its_replay_and_logs_every_example(capsys, tmp_path):
    code, out = fuzz_json(capsys, tmp_path, "--variant", "capture-side-stream", "--nproc", "2",
                          "--examples", "50", "--hypothesis-seed", "0")
    assert code == EXIT_FOUND
    assert set(out) >= {"found", "variant", "checker", "scenario", "examples", "seconds",
                        "replay"}
    assert (out["found"], out["variant"], out["checker"]) == \
        (True, "capture-side-stream", "graphs_capture_work")
    assert out["replay"].startswith("python -m harness run --scenario ")
    assert out["scenario"]["expect"] == {"caught_by": "graphs_capture_work",
                                         "reference": {"capture_on": "runner"}}
    entries = list(read_log(tmp_path / "log.jsonl"))
    examples = [e for e in entries if isinstance(e, ExampleEntry)]
    assert len(examples) == out["examples"]
    assert [e.found for e in entries if isinstance(e, FindingEntry)] == [True]
    # The coverage printed counts every example the search judged, as the log has them.
    logged = coverage_of((v.checker, v.outcome) for e in examples for v in e.verdicts)
    assert out["coverage"] == [c.to_dict() for c in logged]
    assert {c["checker"]: c["failed"] > 0 for c in out["coverage"]}["graphs_capture_work"]


def test_fuzz_pins_what_the_flags_name(capsys, tmp_path):
    code, out = fuzz_json(capsys, tmp_path, "--guard", "merged", "--capture-sizes", "24",
                          "--nproc", "2", "--num-ubatches", "2", "--examples", "200",
                          "--hypothesis-seed", "0")
    assert code == EXIT_FOUND, out
    config = out["scenario"]["config"]
    assert (config["guard"], config["capture_sizes"], config["dp_size"]) == \
        ("merged", [24], 2)
    tokens = [r.get("tokens") for r in out["scenario"]["steps"][0]["ranks"]]
    assert min(tokens) == 12  # exactly half the only graph


@pytest.mark.parametrize("flags, field", [
    (["--guard", "bogus"], "guard"),
    (["--variant", "nope"], "variant"),
    (["--examples", "0"], "examples"),
    (["--nproc", "1"], "dp_size"),
    (["--world", "torchrun", "--backend", "nccl", "--device", "cpu"], "device"),
    (["--world", "sim", "--backend", "nccl"], "backend"),
])
def test_fuzz_answers_bad_input_with_one_line_naming_the_field(capsys, tmp_path, flags, field):
    code = main(["fuzz", "--no-database", "--log", str(tmp_path / "log"), *flags])
    err = capsys.readouterr().err.strip()
    assert code == EXIT_BAD_INPUT
    assert len(err.splitlines()) == 1 and field in err, err


class _Replayed(Exception):
    pass


def test_the_blob_a_search_prints_replays_a_failing_scenario_under_reproduce_failure(tmp_path):
    variant, fixed = variant_named("guard-merged"), {"dp_size": 2}
    drawn: list[Scenario] = []

    @settings(database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def replay(data: st.DataObject) -> None:
        drawn.append(data.draw(scenario_strategy(variant, fixed, (2,))))
        raise _Replayed

    with SimWorld(2, FUZZ_TIMEOUTS) as world:
        # A shrink Hypothesis finishes (some 80 world runs): a cut one has no blob.
        found = fuzz(variant, world.run, world="sim", dp_sizes=(2,), fixed=fixed,
                     budget=Budget(seconds=60, shrink_seconds=60), database=None, seed=1,
                     scenario_dir=tmp_path)
        assert found.found and found.blob and found.blob.startswith("@reproduce_failure(")
        version, blob = ast.literal_eval(found.blob.removeprefix("@reproduce_failure"))
        with pytest.raises(_Replayed):
            reproduce_failure(version, blob)(replay)()
        verdict = first_failure(judge(world.run(drawn[-1])), variant.caught_by)
    assert (verdict.ok, verdict.checker) == (False, found.checker)


def in_phase(phase: list[str], label: str, inner):
    """`inner` with phase[0] naming it while it runs, and the confirmation after it."""
    def marked(*args, **kwargs):
        phase[0] = label
        try:
            return inner(*args, **kwargs)
        finally:
            phase[0] = "confirm"
    return marked


def shrink_runs(tmp_path, monkeypatch, budget: Budget) -> tuple[dict[str, int], object]:
    """A guard-merged search: the world runs made after detection, by phase (Hypothesis's
    shrink, the structural pass, the token pass, the confirmation), and the outcome."""
    phase, runs = ["search"], []
    monkeypatch.setattr(engine, "reduce_structure",
                        in_phase(phase, "structural", engine.reduce_structure))
    monkeypatch.setattr(engine, "reduce_tokens", in_phase(phase, "tokens", engine.reduce_tokens))
    with SimWorld(2, FUZZ_TIMEOUTS) as world:
        def run(scenario):
            runs.append(phase[0])
            return world.run(scenario)
        outcome = fuzz(variant_named("guard-merged"), run, world="sim", dp_sizes=(2,),
                       budget=budget, database=None, seed=0, scenario_dir=tmp_path)
    assert outcome.found and outcome.examples == len(runs), outcome.note
    after = ["hypothesis" if p == "search" else p for p in runs[outcome.examples_to_detection:]]
    return {p: after.count(p) for p in ("hypothesis", "structural", "tokens", "confirm")}, outcome


@pytest.mark.parametrize("shrink_examples", [1, 5])
def test_each_shrinker_stops_after_its_shrink_examples_world_runs(tmp_path, monkeypatch,
                                                                   shrink_examples):
    # Unbounded, Hypothesis's shrink of this search takes tens of world runs; the token pass
    # may converge within a few, so a bound of one is what pins it exactly.
    counts, outcome = shrink_runs(tmp_path, monkeypatch,
                                  Budget(seconds=60, shrink_examples=shrink_examples,
                                         shrink_seconds=600))
    assert counts["hypothesis"] == shrink_examples, counts
    assert 1 <= counts["tokens"] <= shrink_examples, counts
    assert counts["confirm"] <= 2 * search_state.CONFIRM_TRIES, counts
    assert outcome.checker in variant_named("guard-merged").caught_by


def test_a_shrinker_stops_at_its_seconds_before_its_world_runs(tmp_path, monkeypatch):
    counts, _ = shrink_runs(tmp_path, monkeypatch,
                            Budget(seconds=60, shrink_examples=100, shrink_seconds=0))
    assert counts["hypothesis"] == counts["tokens"] == 0, counts


@pytest.mark.parametrize("shrink", [Budget(seconds=60, shrink_examples=0, shrink_seconds=600),
                                    Budget(seconds=60, shrink_seconds=0)],
                         ids=["examples", "seconds"])
def test_hypothesiss_shrink_stops_at_the_first_candidate_past_its_bound(tmp_path, monkeypatch,
                                                                        shrink):
    # Past the bound no candidate is run, yet Hypothesis's shrinker would draw on for
    # hundreds of them (seconds to minutes): the search stops it at the first.
    draws, runs = [], []
    steer = engine.steering
    monkeypatch.setattr(engine, "steering", lambda s: (draws.append(len(runs)), steer(s))[1])
    with SimWorld(2, FUZZ_TIMEOUTS) as world:
        def run(scenario):
            runs.append(scenario)
            return world.run(scenario)
        outcome = fuzz(variant_named("guard-merged"), run, world="sim", dp_sizes=(2,),
                       budget=shrink, database=None, seed=0, scenario_dir=tmp_path)
    assert outcome.found and outcome.checker in variant_named("guard-merged").caught_by
    # Draws once the detection and its rerun have run: Hypothesis's replay of the failure
    # (it begins its shrink so), then the first candidate, which ends it.
    after = [d for d in draws if d >= outcome.examples_to_detection]
    assert len(after) == 2, len(after)
    assert outcome.blob is None  # Hypothesis writes one only for a shrink it finished
