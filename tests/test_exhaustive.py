"""Exhaustive mode: every decode token vector of a small world through the decision layer."""

from __future__ import annotations

import json

from harness.batch import RankBatch
from harness.cli import EXIT_FOUND, EXIT_OK, main
from harness.config import HarnessConfig
from harness.exhaustive import explore
from harness.sut.step_plan import plan_without_world

SMALL = dict(capture_sizes=(16, 32, 48), max_num_reqs=64, max_num_batched_tokens=64,
             decode_threshold=8, prefill_threshold=32)


def test_the_reference_breaks_no_structural_invariant_on_any_small_world():
    for dp, bound in ((2, 64), (3, 40)):
        result = explore(HarnessConfig.of(dp_size=dp, **SMALL), bound)
        assert result.ok, result.counterexamples


def test_sorted_vectors_cover_a_symmetric_world_and_all_vectors_an_asymmetric_one():
    assert explore(HarnessConfig.of(**SMALL), 20).vectors == 21 * 22 // 2
    asymmetric = HarnessConfig.of(**SMALL, threshold_offset_rank=1, threshold_offset=8)
    assert explore(asymmetric, 20).vectors == 21 * 21


def test_the_merged_guard_fails_first_at_a_rank_holding_exactly_half_the_graph():
    result = explore(HarnessConfig.of(**SMALL, guard="merged"), 64)
    (found,) = result.counterexamples
    assert found.checker == "no_empty_region"
    plans = plan_without_world(HarnessConfig.of(**SMALL, guard="merged"),
                               [RankBatch.uniform(n, 1) for n in found.tokens])
    assert min(found.tokens) == plans[0].desc.num_tokens // 2


def test_the_literal_two_fails_with_three_microbatches_and_the_fixed_guard_does_not():
    config = HarnessConfig.of(**{**SMALL, "capture_sizes": (24, 48)}, enable_dbo=False,
                              ubatch_size=3, guard="strict-k2")
    (found,) = explore(config, 48).counterexamples
    assert found.checker == "no_empty_region" and "region(s) [2]" in found.detail
    assert explore(config.with_changes(guard="fixed"), 48).ok


def test_asymmetric_candidates_show_up_as_ranks_that_disagree():
    config = HarnessConfig.of(**SMALL, threshold_offset_rank=1, threshold_offset=16)
    checkers = {c.checker for c in explore(config, 48).counterexamples}
    assert "agreement" in checkers


def test_the_command_exits_1_with_the_counterexample_and_0_when_nothing_breaks(capsys):
    flags = ["--capture-sizes", "16,32", "--max-num-reqs", "64", "--max-num-batched-tokens",
             "64", "--decode-threshold", "8", "--prefill-threshold", "32", "--max-tokens", "32"]
    assert main(["exhaustive", "--json", *flags, "--guard", "merged"]) == EXIT_FOUND
    out = json.loads(capsys.readouterr().out)
    assert out["found"] is True and out["counterexamples"][0]["checker"] == "no_empty_region"
    assert out["vectors"] == 33 * 34 // 2
    assert main(["exhaustive", *flags]) == EXIT_OK
    assert capsys.readouterr().out.strip().endswith("no structural invariant broken")
