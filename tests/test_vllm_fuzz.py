"""The fuzzer pointed at vLLM's own decision functions (`--sut vllm`): from nothing it finds
what vllm 0.33.0 ships, shrinks it, and the world holds vLLM to the harness's reference.

Skipped where vLLM does not import (`make test-vllm` installs it)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from vllm_releases import SHIPS_THE_KNOWN_BUGS, on_installed, release_patch, ships_the_known_bugs

from harness.fuzz.engine import FUZZ_TIMEOUTS, Budget, fuzz
from harness.fuzz.variants import SUT_VARIANTS
from harness.reference_plans import judge_run
from harness.scenario import load_scenario, scenario_from_dict
from harness.sut.thresholds import last_region_start
from harness.vllm_sut.available import (
    installed_release,
    unavailable_reason,
    vllm_version,
)
from harness.world.sim.world import SimWorld

if vllm_version() is None:
    pytest.skip(unavailable_reason(), allow_module_level=True)

known_bugs = pytest.mark.skipif(not ships_the_known_bugs(), reason=f"pins bugs that "
                                f"{SHIPS_THE_KNOWN_BUGS} ship, this is {vllm_version()}")
# Shrunk by world runs (these took 42 and 47, 7 s, on 2026-12-06): the same minimal case on
# any machine; the seconds only bound a slow one.
BUDGET = Budget(examples=400, seconds=None, shrink_examples=150, shrink_seconds=120.0)
GUARD_CHECKERS = ("no_empty_region", "differential", "captured_split")


@known_bugs
@pytest.mark.parametrize("k", [2, 3])
def test_the_fuzzer_finds_the_empty_microbatch_guard_of_vllm_and_shrinks_it(tmp_path, k):
    # Enough requests that every twin is reachable: the guard is what is left to find.
    fixed = {"max_num_reqs": 64, "enable_dbo": k == 2, "ubatch_size": 0 if k == 2 else k,
             "release": installed_release().value}
    with SimWorld(2, FUZZ_TIMEOUTS) as world:
        outcome = fuzz(SUT_VARIANTS["vllm"], world.run, world="sim", dp_sizes=(2,),
                       fixed=fixed, budget=BUDGET, database=None, scenario_dir=tmp_path,
                       seed=0)
    assert outcome.found and outcome.checker in GUARD_CHECKERS, outcome.detail
    shrunk = outcome.scenario
    tokens = [sum(r.query_lens) for r in shrunk.steps[-1]]  # a draft request holds several
    graph = next(g for g in shrunk.config.cudagraph_capture_sizes if g >= max(tokens))
    # Shrunk to the fewest tokens `2 * min < G` lets by, ceil(G / 2) (no fewer than the decode
    # threshold), which still leaves the last region empty (both are G / 2 for k = 2).
    lowest = max(-(-graph // 2), shrunk.config.serving.decode_threshold)
    assert min(tokens) == lowest, shrunk.to_json()
    assert min(tokens) <= last_region_start(graph, k)


@known_bugs
def test_the_differential_verdict_shows_vllm_and_the_reference_side_by_side():
    scenario = scenario_from_dict({
        "config": {"sut": "vllm", "release": installed_release().value, "capture_sizes": [32, 64],
                   "max_num_reqs": 64, "max_num_batched_tokens": 64, "decode_threshold": 8,
                   "prefill_threshold": 32},
        "steps": [{"ranks": [32, 64]}, {"ranks": [40, 64]}]})
    with SimWorld(2, FUZZ_TIMEOUTS) as world:
        result = judge_run(world.run(scenario))
    step0 = {v.checker: v for v in result.steps[0].verdicts}
    assert not step0["differential"].ok
    assert "full-microbatched (reference: eager-microbatched)" in step0["differential"].detail
    assert "FULL/64tok/64req/uct1/ub2 (reference: NONE/64tok" in step0["differential"].detail
    assert not step0["no_empty_region"].ok
    assert all(v.ok for v in result.steps[1].verdicts)  # [40, 64]: both replay the twin


VLLM_SCENARIOS = sorted((Path(__file__).resolve().parents[1] / "scenarios" / "vllm")
                        .glob("*.json"))


# What the hunts found on one release's new surfaces, replayed where that release is installed.
# (Those of vLLM's execution code need a process per rank: tests/test_vllm_exec.py runs them.)
RELEASE_SCENARIOS = sorted(p for p in (Path(__file__).resolve().parents[1] / "scenarios" / "vllm")
                           .glob("[0-9]*/*.json") if '"execution": "vllm"' not in p.read_text())


@pytest.mark.parametrize("path", RELEASE_SCENARIOS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_each_finding_on_a_release_is_caught_there_and_clean_with_the_harness_deciding(path):
    if installed_release().value != path.parent.name:
        pytest.skip(f"found on vLLM {path.parent.name}; {vllm_version()} is installed")
    _caught_and_clean(path)


# A release finding the project has a fix for, and the fix (scenarios/vllm/patches/<release>/).
RELEASE_FIXES = {"0.34/unreachable-twins-dynamic-drafts": "twin-threshold-by-query-len.diff"}


@pytest.mark.parametrize("finding, patch", sorted(RELEASE_FIXES.items()))
def test_a_release_finding_replays_clean_under_its_fix_held_to_the_unpatched_vllm(finding,
                                                                                  patch):
    path = Path(__file__).resolve().parents[1] / "scenarios" / "vllm" / f"{finding}.json"
    if installed_release().value != path.parent.name:
        pytest.skip(f"found on vLLM {path.parent.name}; {vllm_version()} is installed")
    scenario = on_installed(load_scenario(path))
    # Against base too: the fix may change no decision the unpatched vLLM got right.
    fixed = replace(scenario, config=scenario.config.with_changes(
        vllm_patches=(release_patch(patch),), differential_against_base=True))
    with SimWorld(scenario.config.serving.dp_size, FUZZ_TIMEOUTS) as world:
        result = judge_run(world.run(fixed))
    assert result.ok, result.failed_verdicts()
    judged = {v.checker for v in result.verdicts() if v.applied}
    assert {scenario.caught_by, "differential_base"} <= judged, judged


def _caught_and_clean(path: Path) -> None:
    scenario = on_installed(load_scenario(path))
    with SimWorld(scenario.config.serving.dp_size, FUZZ_TIMEOUTS) as world:
        found = judge_run(world.run(scenario))
        clean = judge_run(world.run(scenario.with_reference_behaviour()))
    assert scenario.caught_by in [v.checker for _, v in found.failed_verdicts()]
    assert clean.ok, clean.failed_verdicts()


@known_bugs
@pytest.mark.parametrize("path", VLLM_SCENARIOS, ids=lambda p: p.stem)
def test_each_finding_on_vllm_is_caught_and_clean_with_the_harness_deciding(path):
    _caught_and_clean(path)
