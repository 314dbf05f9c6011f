"""The fuzzer against vLLM's own execution code (0.33.0's and 0.34.0's ubatching.py are the
same), from an empty database, on torchrun rank processes: it finds the sibling-failure hang
and the NoneType recv-hook crash, each shrunk to one step and named; the two planted
stream-order slips (a missing compute wait, an ids gather that waited before the router) are
found by stream_order alone; a fault-free search with the harness deciding holds every
checker. Slow (minutes): `make test-vllm` runs it. Skipped where vLLM does not import."""

from __future__ import annotations

import pytest
from vllm_releases import SHIPS_THE_KNOWN_BUGS, ships_the_known_bugs

from harness.fuzz.engine import FUZZ_TIMEOUTS, Budget, fuzz
from harness.fuzz.variants import EXEC_VARIANTS
from harness.vllm_sut.available import installed_release, unavailable_reason, vllm_version
from harness.world.pool import WorldPool

if vllm_version() is None:
    pytest.skip(unavailable_reason(), allow_module_level=True)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not ships_the_known_bugs(), reason=f"the findings are "
                                 f"{SHIPS_THE_KNOWN_BUGS}'s, not {vllm_version()}'s")]
# Bounded by world runs, not seconds: the same search on any machine. Up to its 250th example
# Hypothesis draws as under a time budget (it turns to targets at max_examples // 2; a bound of
# 60 drew another path, where the crash was not found): seeded, the hang is found at the 22nd
# run, the crash at the 29th (61 and 102 s here, 2026-12-06; a hang or a crash costs 11-25 s).
# Every assertion (the checker, the frame, one step) holds once the structural pass has run, so
# Hypothesis's shrink and the token pass stop at their first candidate: each world run there
# cost 11-25 s and a relaunch (5 per shrinker took 90-120 s more per hunt).
BUDGET = Budget(examples=500, seconds=None, shrink_examples=0, shrink_seconds=120.0)
# The stream-order hunts are found at the 7th run and shrink in 52-53 runs, 3-6 s (2026-12-06).
STREAM_BUDGET = Budget(examples=500, seconds=None, shrink_examples=150, shrink_seconds=120.0)
BOUND_S = 540


def hunt(pool, tmp_path, name: str, budget: Budget = BUDGET):
    # `pool`: the session's vLLM worlds (conftest.py vllm_exec_pool), booted once per worker.
    variant = EXEC_VARIANTS[name]
    return fuzz(variant, pool.run, world="torchrun", dp_sizes=(2,), budget=budget,
                database=None, scenario_dir=tmp_path, seed=0, hunt=variant.hunt,
                fixed={"release": installed_release().value})


@pytest.mark.starts_first  # the two longest of `make test-vllm`: one per worker, from the start
@pytest.mark.timeout(BOUND_S)
def test_the_fuzzer_finds_vllms_sibling_failure_hang_and_names_the_parked_frame(
        vllm_exec_pool, tmp_path):
    outcome = hunt(vllm_exec_pool, tmp_path, "vllm-exec-hang")
    assert outcome.found and outcome.checker == "liveness", outcome.note
    assert "vllm/v1/worker/ubatching.py" in outcome.detail
    assert len(outcome.scenario.steps) == 1 and len(outcome.scenario.faults) == 1


@pytest.mark.starts_first
@pytest.mark.timeout(BOUND_S)
def test_the_fuzzer_finds_vllms_recv_hook_crash_with_its_line(vllm_exec_pool, tmp_path):
    outcome = hunt(vllm_exec_pool, tmp_path, "vllm-exec-crash")
    assert outcome.found and outcome.checker == "errors", outcome.note
    assert "'NoneType' object has no attribute 'recv_hook'" in outcome.detail
    assert "vllm/v1/worker/ubatching.py:" in outcome.detail
    assert len(outcome.scenario.steps) == 1


@pytest.mark.timeout(BOUND_S)
def test_a_fault_free_search_of_vllms_execution_holds_every_checker(vllm_exec_pool, tmp_path):
    outcome = hunt(vllm_exec_pool, tmp_path, "vllm-exec", Budget(examples=40, seconds=None))
    assert not outcome.found, outcome.detail
    assert outcome.examples >= 30  # world runs; Hypothesis counts the examples it rejected too


@pytest.mark.timeout(BOUND_S)
def test_the_fuzzer_finds_a_missing_compute_wait_by_stream_order_alone(vllm_exec_pool,
                                                                       tmp_path):
    outcome = hunt(vllm_exec_pool, tmp_path, "ht-missing-compute-wait", STREAM_BUDGET)
    assert outcome.found and outcome.checker == "stream_order", outcome.note
    assert "experts on stream default reads dispatch recv of microbatch" in outcome.detail
    assert len(outcome.scenario.steps) == 1 and not outcome.scenario.faults


@pytest.mark.timeout(BOUND_S)
def test_the_fuzzer_finds_an_ids_gather_that_waited_before_the_router_on_the_sim_world(
        tmp_path):
    variant = EXEC_VARIANTS["ids-gather-early-wait"]
    # The sim world hands vLLM's execution to a torchrun world of the same size.
    with WorldPool("sim", "gloo", FUZZ_TIMEOUTS, 2, preload_vllm=True) as pool:
        outcome = fuzz(variant, pool.run, world="sim", dp_sizes=(2,),
                       budget=STREAM_BUDGET, database=None,
                       scenario_dir=tmp_path, seed=0, hunt=variant.hunt,
                       fixed={"release": installed_release().value})
    assert outcome.found and outcome.checker == "stream_order", outcome.note
    assert "all_gather on stream vllm-comm-" in outcome.detail
    assert "reads top-k ids of microbatch" in outcome.detail
    assert len(outcome.scenario.steps) == 1 and not outcome.scenario.faults
