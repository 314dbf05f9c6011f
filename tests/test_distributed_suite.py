"""The distributed suite: the same tests on whichever world the session runs
(`--world sim|torchrun`, `--nproc N`): every regression scenario, Hypothesis over DP skew of
the reference, and the fuzzer finding each planted bug from nothing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scenario_width import with_dp_size

from harness.check.judge import judge
from harness.dead_ranks import has_deaths
from harness.fuzz.engine import Budget, fuzz, scenario_strategy
from harness.fuzz.variants import VARIANTS
from harness.scenario import load_scenario, scenario_from_dict
from harness.sut.thresholds import last_region_start

pytestmark = pytest.mark.dist

SCENARIOS = sorted((Path(__file__).resolve().parents[1] / "scenarios").glob("*.json"))
# The searches measured the longest on the 2-core machine first (docs/measurements.md): each
# relaunches its world per failing example, or waits out a collective timeout.
LONGEST = ("a2a-unpadded-sizes", "stock-protocol", "guard-strict-k2", "asymmetric-candidates",
           "guard-merged", "idle-rank-returns-early")
BUGS = sorted((name for name, v in VARIANTS.items() if not v.is_reference),
              key=lambda name: LONGEST.index(name) if name in LONGEST else len(LONGEST))
# World runs to detection: the search is seeded, so this is a fixed path, not a timer. The
# seconds only bound a slow world (4 NCCL ranks on one GPU took 332 s for 101 examples of the
# stock protocol): the search then ends with its own outcome, before pytest's timeout fires
# inside Hypothesis and reads as a flaky failure.
# The shrink is bounded by world runs, so the minimality asserts below hold however slow the
# machine: 150 per shrinker, where the guards' shrinks took 80 and the longest 306 (sim, DP 2,
# 2026-12-06); the seconds only bound a world too slow for that.
DETECTION_BUDGET = Budget(examples=400, seconds=240.0, shrink_examples=150, shrink_seconds=150.0)
DETECTION_TIMEOUT_S = 600  # the search's bound, both shrinkers' bounds, the confirmation


def describe(result) -> str:
    failures = "\n".join(f"  step {s}: {v.checker}: {v.detail}"
                         for s, v in result.failed_verdicts())
    return (f"{failures}\n{result.evidence}\nreplay: save the scenario below and run "
            f"`python -m harness run --scenario FILE`\n{result.scenario.to_json()}")


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_each_regression_scenario_is_caught_on_the_world_and_clean_in_the_reference(
        world, path):
    scenario = load_scenario(path)
    if has_deaths(scenario) and world.nproc < scenario.config.serving.dp_size:
        pytest.skip(f"{path.stem}: survivors told of a death at different steps need "
                    f"{scenario.config.serving.dp_size} ranks; this world has {world.nproc}")
    scenario = with_dp_size(scenario, world.nproc)
    buggy = world.judged(scenario)
    expected = scenario.expected_checker(world.graphs)
    assert expected in [v.checker for _, v in buggy.failed_verdicts()], describe(buggy)
    clean = world.judged(scenario.with_reference_behaviour())
    assert clean.ok, describe(clean)


# Skew only: faults have tests of their own and the fuzzer's reference run, and a faulted
# example costs its peers' timeouts, so 200 fault-free draws fit where 15 faulted ones did.
SKEW_ONLY = replace(VARIANTS["reference"], fault_kinds=())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_checker_holds_on_skewed_dp_steps_of_the_reference(world, data):
    scenario = data.draw(scenario_strategy(SKEW_ONLY, {}, (world.nproc,)))
    result = world.judged(scenario)
    assert result.ok, describe(result)


def test_the_searches_started_first_are_planted_bugs_and_lead_the_order():
    assert set(LONGEST) <= set(BUGS) and BUGS[:len(LONGEST)] == list(LONGEST)


def test_every_rank_stops_after_a_step_in_which_any_rank_failed(world):
    # Found by the fuzzer on the torchrun world: the rank whose microbatch was faulted
    # stopped, its peer went on to the next step's sync alone and was reported as hung.
    scenario = scenario_from_dict({
        "name": "peer-goes-on-alone",
        "config": {"dp_size": world.nproc, "cudagraph_mode": "NONE",
                   "all2all_backend": "deepep_high_throughput", "decode_threshold": 2,
                   "prefill_threshold": 16, "max_num_reqs": 4, "max_num_batched_tokens": 64},
        "steps": [{"ranks": [{"query_lens": [28]}] + [{"query_lens": [16]}] * (world.nproc - 1)},
                  {"ranks": [{"query_lens": [46]}] * world.nproc}],
        "faults": [{"kind": "return_without_yielding", "rank": 1, "step": 0, "ubatch": 1}]})
    result = world.judged(scenario)
    assert result.ok, describe(result)
    assert len(result.steps) == 1
    assert any(r.error is not None for r in result.steps[0].records)


def graph_of(config, tokens: int) -> int:
    return next(g for g in config.cudagraph_capture_sizes if g >= tokens)


@pytest.mark.starts_first
@pytest.mark.timeout(DETECTION_TIMEOUT_S)
@pytest.mark.parametrize("name", BUGS)
def test_the_fuzzer_finds_each_planted_bug_from_nothing_and_shrinks_it(
        request, record_property, fuzz_world, tmp_path, name):
    variant = VARIANTS[name]
    if (why := variant.fits((fuzz_world.nproc,))) is not None:
        pytest.skip(why)
    outcome = fuzz(variant, fuzz_world.run, world=request.config.getoption("--world"),
                   dp_sizes=(fuzz_world.nproc,), budget=DETECTION_BUDGET, database=None,
                   scenario_dir=tmp_path, seed=0)
    # Time to detection apart from the shrink and replays, for JUnit (`--junitxml`).
    record_property("seconds_to_detection", outcome.seconds_to_detection)
    record_property("examples_to_detection", outcome.examples_to_detection)
    assert outcome.found, (f"{name}: nothing found in {outcome.examples} examples, "
                           f"{outcome.seconds:.0f} s ({outcome.note})")
    assert outcome.checker in variant.caught_by, outcome.detail
    shrunk = outcome.scenario
    assert len(shrunk.steps) == variant.min_steps, shrunk.to_json()
    tokens = [sum(r.query_lens) for r in shrunk.steps[0]]  # a draft request holds several
    if name.startswith("guard-"):
        # The minimal case: the fewest tokens the guard lets by (G / 2 for `<`, one more for
        # `<=`; no fewer than the decode threshold), with the last region still empty.
        graph, k = graph_of(shrunk.config, max(tokens)), shrunk.config.num_ubatches
        lowest = -(-graph // 2) if name == "guard-merged" else graph // 2 + 1
        assert min(tokens) == max(lowest, shrunk.config.serving.decode_threshold), shrunk.to_json()
        assert min(tokens) <= last_region_start(graph, k)
    if name == "stock-protocol":
        assert [f.kind.value for f in shrunk.faults] == ["raise_in_ubatch"]
    # The saved scenario is a regression scenario: caught as such, clean once undone.
    replayed = load_scenario(outcome.replay.split("--scenario ")[1].split(" ")[0])
    again = judge(fuzz_world.run(replayed))
    assert replayed.caught_by in [v.checker for _, v in again.failed_verdicts()]
    assert judge(fuzz_world.run(replayed.with_reference_behaviour())).ok


# The staged reference: real-token staging (docs/spec.md §3.4) must hold every checker where
# it replays steps the fixed guard sends to eager.
@pytest.mark.parametrize("name", ["reference", "staged-reference"])
def test_the_fuzzer_finds_nothing_on_the_reference(request, fuzz_world, tmp_path, name):
    outcome = fuzz(VARIANTS[name], fuzz_world.run,
                   world=request.config.getoption("--world"), dp_sizes=(fuzz_world.nproc,),
                   budget=Budget(examples=60, seconds=None), database=None,
                   scenario_dir=tmp_path, seed=1)
    assert not outcome.found, f"{outcome.checker}: {outcome.detail}\n" + (
        outcome.scenario.to_json() if outcome.scenario else "")
    # Hypothesis's own count includes repeats the memo answers: the world ran fewer.
    assert outcome.note == "examples exhausted" and outcome.examples > 0
