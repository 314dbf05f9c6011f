"""A hunt for one failure class of vLLM's code as it ships (`fuzz --sut vllm --exec vllm` runs
one per class of #55586) sorts only what faulted examples fail of: a fault-free example's
failure is a finding whatever checker it fails, or a wrong result would pass both hunts."""

from __future__ import annotations

import pytest

import harness.fuzz.search_state as search_state
from harness.batch import RankBatch
from harness.check.judge import ScenarioResult, StepResult
from harness.check.verdict import Outcome, Verdict
from harness.config import HarnessConfig
from harness.faults import Fault, FaultKind
from harness.fuzz.search_state import Budget, Search
from harness.fuzz.unsteered import unsteered
from harness.fuzz.variants import EXEC_VARIANTS, VARIANTS, Variant
from harness.scenario import Scenario

CONFIG = HarnessConfig.of(dp_size=2, cudagraph_mode="NONE", capture_sizes=(), max_num_reqs=16,
                          max_num_batched_tokens=16, decode_threshold=2, prefill_threshold=4)
STEP = tuple(RankBatch.from_query_lens((1,) * n) for n in (6, 8))
FAULT_FREE = Scenario(CONFIG, (STEP,), ())
FAULTED = Scenario(CONFIG, (STEP,), (Fault(FaultKind.RAISE_IN_UBATCH, 1, 0),))


def _wrong_rows(scenario: Scenario) -> ScenarioResult:
    """A run whose rows differ from the reference's: matches_reference failed, nothing hung."""
    wrong = Verdict("matches_reference", Outcome.FAILED, "rank 1 row 3 differs")
    return ScenarioResult(scenario, (None, None), (), (StepResult((None, None), (wrong,)),))


def _search(variant: Variant, hunt: tuple[str, ...] | None, monkeypatch) -> Search:
    monkeypatch.setattr(search_state, "judge_run", lambda history: _wrong_rows(history))
    return Search(lambda scenario: scenario, variant, "sim", Budget(seconds=None), None, None,
                  hunt=hunt)


@pytest.mark.parametrize("hunted", [EXEC_VARIANTS["vllm-exec-hang"],
                                    unsteered(EXEC_VARIANTS["vllm-exec-crash"])],
                         ids=["its-own-search", "the-references-search"])
def test_a_class_hunt_reports_a_wrong_result_of_a_fault_free_example(hunted, monkeypatch):
    assert hunted.hunts_a_shipped_class
    search = _search(hunted, hunted.hunt, monkeypatch)
    verdict = search.verdict(FAULT_FREE)
    assert not verdict.ok and verdict.checker == "matches_reference"


def test_a_class_hunt_still_sorts_out_what_a_faulted_example_fails_outside_its_class(
        monkeypatch):
    hang = EXEC_VARIANTS["vllm-exec-hang"]
    assert _search(hang, hang.hunt, monkeypatch).verdict(FAULTED).ok


def test_a_hunt_that_narrows_a_search_to_one_checker_counts_nothing_else_even_fault_free(
        monkeypatch):
    # A planted slip's own search, and a hunt handed in beside a variant of none (the
    # enumeration's cross-check): their filters count only their checkers, faults or not.
    slip = EXEC_VARIANTS["ht-missing-compute-wait"]
    assert not slip.hunts_a_shipped_class
    assert _search(slip, slip.hunt, monkeypatch).verdict(FAULT_FREE).ok
    cross = Variant("cross-check", "a class on a pinned config", caught_by=("agreement",))
    assert _search(cross, ("agreement",), monkeypatch).verdict(FAULT_FREE).ok
    assert not _search(VARIANTS["reference"], None, monkeypatch).verdict(FAULT_FREE).ok
