"""The two upstream fixes of vLLM's empty-microbatch guard, run as patches over vllm 0.33.0:
what each repairs and what it leaves, by the fuzzer, the exhaustive mode, the differential
against the unpatched vLLM, on the sim world and in torchrun rank processes.

Skipped where vLLM does not import (`make test-vllm` installs it)."""

from __future__ import annotations

import shutil
from argparse import Namespace
from pathlib import Path

import pytest
from vllm_releases import SHIPS_THE_KNOWN_BUGS, on_installed, release_patch, ships_the_known_bugs

from harness.cli import main
from harness.cli_vllm import vllm_fields
from harness.config import HarnessConfig, ubatching_fields
from harness.errors import ConfigError
from harness.exhaustive import explore
from harness.fuzz.engine import FUZZ_TIMEOUTS, Budget, fuzz
from harness.fuzz.variants import SUT_VARIANTS
from harness.reference_plans import judge_run
from harness.scenario import load_scenario, scenario_from_dict
from harness.sut.thresholds import last_region_start
from harness.vllm_code.source import VllmPatch, content_hash
from harness.vllm_sut.available import (
    installed_release,
    unavailable_reason,
    vllm_version,
)
from harness.world.sim.world import SimWorld

if vllm_version() is None:
    pytest.skip(unavailable_reason(), allow_module_level=True)

known_bugs = pytest.mark.skipif(not ships_the_known_bugs(), reason=f"the guard the patches "
                                f"fix is {SHIPS_THE_KNOWN_BUGS}'s, this is {vllm_version()}")
ROOT = Path(__file__).resolve().parents[1]
INCLUSIVE = release_patch("pr57020-inclusive.diff")
LAST_REGION = release_patch("last-region-start.diff")
# One budget for every cell, the same that finds the unpatched guard at k = 4 below and the
# inclusive guard's k = 3 miss: a clean cell is clean where a bug would have been found.
# Shrunk by world runs (the inclusive guard's took 64 on 2026-12-06), so the edge it is
# shrunk to does not depend on the machine's speed: the seconds only stop a stuck shrink (at
# 120 s a busy CI machine, load 10, stopped it at 20 tokens, short of the edge at 17).
BUDGET = Budget(examples=100, seconds=None, shrink_examples=150, shrink_seconds=600.0)
GUARD_CHECKERS = ("no_empty_region", "differential", "captured_split")


def fuzz_vllm(tmp_path, k: int, patches: tuple[VllmPatch, ...]):
    # One token per decode: with drafts 0.34.0 has other families (twins of narrower query
    # lengths no batch reaches, its request cut): scenarios/vllm/0.34 holds those.
    fixed = {"max_num_reqs": 64, **ubatching_fields(k), "vllm_patches": patches,
             "release": installed_release().value, "decode_query_len": 1}
    with SimWorld(2, FUZZ_TIMEOUTS) as world:
        return fuzz(SUT_VARIANTS["vllm"], world.run, world="sim", dp_sizes=(2,), fixed=fixed,
                    budget=BUDGET, database=None, scenario_dir=tmp_path, seed=0)


def last_step_tokens_and_graph(outcome) -> tuple[list[int], int]:
    tokens = [len(r.query_lens) for r in outcome.scenario.steps[-1]]
    graph = next(g for g in outcome.scenario.config.cudagraph_capture_sizes
                 if g >= max(tokens))
    return tokens, graph


@known_bugs
def test_the_budget_finds_the_unpatched_guard_at_four_microbatches(tmp_path):
    outcome = fuzz_vllm(tmp_path, 4, ())
    assert outcome.found and outcome.checker in GUARD_CHECKERS, outcome.note


@known_bugs
@pytest.mark.parametrize("k, patch", [(2, INCLUSIVE), (2, LAST_REGION), (3, LAST_REGION),
                                      (4, LAST_REGION)], ids=lambda v: getattr(v, "name", v))
def test_a_fix_leaves_its_configs_clean_within_the_budget(tmp_path, k, patch):
    outcome = fuzz_vllm(tmp_path, k, (patch,))
    assert not outcome.found, f"{outcome.checker}: {outcome.detail}"
    assert outcome.examples >= 50, outcome.note  # the budget was spent searching


@known_bugs
def test_the_inclusive_guard_still_leaves_three_microbatches_empty_shrunk_to_the_edge(
        tmp_path):
    outcome = fuzz_vllm(tmp_path, 3, (INCLUSIVE,))
    assert outcome.found and outcome.checker in GUARD_CHECKERS, outcome.note
    tokens, graph = last_step_tokens_and_graph(outcome)
    # Shrunk to the fewest tokens `2 * min <= G` lets by, G // 2 + 1 (no fewer than the decode
    # threshold); with k = 3 that is still at or below the last region's start: it is empty.
    threshold = outcome.scenario.config.serving.decode_threshold
    assert min(tokens) == max(graph // 2 + 1, threshold), outcome.scenario.to_json()
    assert min(tokens) <= last_region_start(graph, 3)
    saved = next(tmp_path.glob("vllm-*.json")).read_text()
    assert INCLUSIVE.sha256 in saved and "diff --git" not in saved


def exhaustive(patches: tuple[VllmPatch, ...], dp: int, k: int, tokens: int):
    # The lowest decode threshold: every graph of the ladder has microbatched twins.
    config = HarnessConfig.of(dp_size=dp, max_num_reqs=tokens, max_num_batched_tokens=tokens,
                              decode_threshold=k, sut="vllm", vllm_patches=patches,
                              release=installed_release().value, **ubatching_fields(k))
    return explore(config, tokens)


# The full bounds (512 tokens at DP 2, 96 at DP 3) take 45 and 90 s here (one vLLM sync per
# rank per vector): `make test-vllm` runs them first, the fast suite keeps to a sixth of that.
@known_bugs
@pytest.mark.parametrize("dp, k, tokens", [
    (2, 2, 128), (3, 3, 36),
    pytest.param(2, 2, 512, marks=[pytest.mark.slow, pytest.mark.starts_first]),
    pytest.param(3, 3, 96, marks=[pytest.mark.slow, pytest.mark.starts_first]),
])
def test_the_exhaustive_mode_finds_nothing_with_the_last_region_guard(dp, k, tokens):
    result = exhaustive((LAST_REGION,), dp, k, tokens)
    assert result.ok, result.counterexamples


@known_bugs
@pytest.mark.parametrize("patches, k", [((), 2), ((INCLUSIVE,), 3)], ids=["none", "pr57020"])
def test_the_exhaustive_mode_finds_the_guard_the_patch_leaves(patches, k):
    result = exhaustive(patches, 3, k, 24)
    assert [c.checker for c in result.counterexamples] == ["no_empty_region"]


def patched(text: str, old: str, new: str, name: str) -> VllmPatch:
    assert old in text
    body = text.replace(old, new)
    return VllmPatch(name, content_hash(body), body)


def guard_scenario(tokens: list[int], patch: VllmPatch):
    return scenario_from_dict({
        "config": {"sut": "vllm", "release": installed_release().value, "capture_sizes": [4],
                   "max_num_reqs": 64, "max_num_batched_tokens": 64, "decode_threshold": 2,
                   "prefill_threshold": 4, "vllm_patches": [patch.to_dict()],
                   "differential_against_base": True},
        "steps": [{"ranks": tokens}]})


@known_bugs
def test_the_differential_against_base_names_a_decision_the_fix_was_not_meant_to_change():
    # Over-reaching: this guard also sends [3, 4] on a 4-token graph to eager, which the
    # unpatched vLLM (and the reference) replay as a microbatched graph.
    greedy = patched(INCLUSIVE.diff, "<= ubatch_desc.num_tokens:",
                     "<= ubatch_desc.num_tokens + 2:", "greedy.diff")
    with SimWorld(2, FUZZ_TIMEOUTS) as world:
        result = judge_run(world.run(guard_scenario([3, 4], greedy)))
        fixed = judge_run(world.run(guard_scenario([2, 4], LAST_REGION)))
    verdicts = {v.checker: v for v in result.steps[0].verdicts}
    assert not verdicts["differential_base"].ok
    assert verdicts["differential_base"].detail == (
        "rank 0: decision: eager-microbatched (base vllm: full-microbatched, reference: "
        "full-microbatched): a decision the unpatched vLLM got right")
    step = {v.checker: v for v in fixed.steps[0].verdicts}
    assert fixed.ok, fixed.failed_verdicts()
    assert "changed where the base vllm was wrong" in step["differential_base"].detail


@known_bugs
def test_every_torchrun_rank_process_runs_the_patched_code(capsys):
    scenario = str(ROOT / "scenarios" / "vllm" / "guard-half-graph-k2.json")
    assert main(["run", "--scenario", scenario, "--world", "torchrun"]) == 1
    assert main(["run", "--scenario", scenario, "--world", "torchrun",
                 "--vllm-patch", INCLUSIVE.path]) == 0
    out = capsys.readouterr().out
    assert "patched with pr57020-inclusive.diff" in out and "no checker failed" in out


@known_bugs
def test_a_checkout_given_by_vllm_src_decides_and_is_named_with_its_commit(tmp_path, capsys):
    installed = Path(vllm_version.__globals__["importlib"].util.find_spec("vllm").origin).parent
    for rel in ("v1/worker/ubatch_utils.py", "v1/worker/gpu/cudagraph_utils.py",
                "v1/worker/gpu/dp_utils.py"):
        (tmp_path / "vllm" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(installed / rel, tmp_path / "vllm" / rel)
    dp_utils = tmp_path / "vllm" / "v1" / "worker" / "gpu" / "dp_utils.py"
    dp_utils.write_text(dp_utils.read_text().replace(
        "min()) < ubatch_desc.num_tokens:", "min()) <= ubatch_desc.num_tokens:"))
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("cd" * 20 + "\n")
    argv = ["decide", "--tokens", "2,4", "--capture-sizes", "4", "--decode-threshold", "2",
            "--prefill-threshold", "4", "--sut", "vllm"]
    assert main(argv) == 0
    assert "full-microbatched" in capsys.readouterr().out
    assert main([*argv, "--vllm-src", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"at {tmp_path}, git {'cd' * 6}" in out and "eager-microbatched" in out


@known_bugs
def test_a_stale_patch_is_one_line_and_exit_2(tmp_path, capsys):
    stale = tmp_path / "stale.diff"
    stale.write_text(INCLUSIVE.diff.replace(" num_active_loras=num_active_loras,",
                                            " num_active_loras=0,"))
    scenario = on_installed(load_scenario(ROOT / "scenarios" / "vllm" / "guard-half-graph-k2.json"))
    path = tmp_path / "s.json"
    path.write_text(scenario.to_json())
    assert main(["run", "--scenario", str(path), "--vllm-patch", str(stale)]) == 2
    err = capsys.readouterr().err
    assert "stale.diff: hunk 1 of vllm/v1/worker/gpu/dp_utils.py" in err
    assert err.count("\n") == 1


def test_the_matrix_reads_the_release_of_the_tree_not_of_its_patches_stacked():
    # Both patches rewrite the guard's line: stacked, the second no longer applies. The matrix
    # applies each alone, and the release is the tree's.
    args = Namespace(sut="vllm", vllm_patch=[INCLUSIVE.path, LAST_REGION.path], vllm_src=None,
                     differential_against=None, execution="harness")
    fields = vllm_fields(args, "vllm", each_alone=True)
    assert fields["release"] == installed_release().value
    with pytest.raises(ConfigError):
        vllm_fields(args, "vllm")  # stacked, as run and fuzz take them, they do not apply
