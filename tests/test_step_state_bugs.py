"""The state a step carries that the second round of vLLM's bugs lives in (docs/spec.md
§4.4 step 4, §7.18-7.23): cached counts of continued requests, the storage a replay reads,
an idle rank's part in a step, the drafter's reused sync state, the dispatch's readiness tag."""

from __future__ import annotations

import gc
import weakref
from dataclasses import replace

import pytest
from record_builders import step_records

from harness.batch import RankBatch
from harness.bug_switches import Continuation
from harness.check.execution import check_fresh_receive
from harness.check.judge import judge
from harness.check.verdict import Outcome
from harness.config import HarnessConfig
from harness.model.state import RequestSpec
from harness.model.step_buffers import StepBuffers, UbatchMetadata, prepare_microbatch
from harness.model.ubatch_slice import UbatchSlice
from harness.scenario import scenario_from_dict
from harness.sut.dp_sync import decide_from_matrix, local_column
from harness.sut.graph_table import GraphTable
from harness.timeouts import Timeouts
from harness.world.sim.world import SimWorld


def twelve_token_prefill_after(context: int) -> StepBuffers:
    step = StepBuffers(16, 2, hidden_size=4, scratch_slot=7)
    step.fill([RequestSpec(0, context, tuple(range(12))), RequestSpec(1, 3, (5,))])
    return step


def test_a_continued_request_counts_its_tokens_in_the_earlier_microbatch_as_cached():
    step = twelve_token_prefill_after(context=20)
    first = prepare_microbatch(step, UbatchMetadata(4), UbatchSlice(0, 1, 0, 8))
    second = prepare_microbatch(step, UbatchMetadata(4), UbatchSlice(0, 2, 8, 16))
    assert first.computed.tolist() == [20]
    assert second.computed.tolist() == [28, 3]  # 20 before the step, 8 in microbatch 0


def test_the_stale_continuation_counts_only_what_was_cached_before_the_step():
    step = twelve_token_prefill_after(context=20)
    second = prepare_microbatch(step, UbatchMetadata(4), UbatchSlice(0, 2, 8, 16),
                                continuation=Continuation.STALE)
    assert second.computed.tolist() == [20, 3]


def test_a_rebinding_prepare_leaves_the_storage_a_graph_captured_unwritten():
    step, meta = twelve_token_prefill_after(context=20), UbatchMetadata(4)
    captured = meta.computed
    prepare_microbatch(step, meta, UbatchSlice(0, 2, 8, 16))
    assert captured[:2].tolist() == [28, 3] and meta.computed is captured
    captured.zero_()
    mb = prepare_microbatch(step, meta, UbatchSlice(0, 2, 8, 16), rebind_lookback=True)
    assert captured[:2].tolist() == [0, 0] and mb.computed.tolist() == [28, 3]


def test_the_storage_a_graph_captured_outlives_every_rebinding_prepare():
    # On real CUDA graphs a freed capture storage goes to other tensors, and the slip would
    # read garbage in one step (seen on the H100); kept alive, it reads an earlier run's counts.
    step, meta = twelve_token_prefill_after(context=20), UbatchMetadata(4)
    captured = weakref.ref(meta.computed)
    for _ in range(3):
        prepare_microbatch(step, meta, UbatchSlice(0, 2, 8, 16), rebind_lookback=True)
    gc.collect()
    assert captured() is not None and captured() is not meta.computed


def run(config: dict, ranks: list) -> object:
    scenario = scenario_from_dict({"config": config, "steps": [{"ranks": r} for r in ranks]})
    world = SimWorld(2, Timeouts())
    try:
        return judge(world.run(scenario))
    finally:
        world.close()


def failed_checkers(result) -> set[str]:
    return {v.checker for _, v in result.failed_verdicts()}


EAGER_SPLIT = {"cudagraph_mode": "NONE", "max_num_reqs": 4, "max_num_batched_tokens": 64,
               "decode_threshold": 2, "prefill_threshold": 4}


def test_a_prefill_split_over_microbatches_matches_the_reference_only_when_counted():
    ranks = [[{"query_lens": [12]}, {"query_lens": [12]}]]
    assert run(EAGER_SPLIT, ranks).ok
    stale = run({**EAGER_SPLIT, "continuation": "stale"}, ranks)
    assert "matches_reference" in failed_checkers(stale)


def test_a_rank_that_returns_early_is_named_by_the_collectives_it_never_issued():
    result = run({**EAGER_SPLIT, "idle_step": "skip"}, [[{"tokens": 4}, {"tokens": 0}]])
    records = result.steps[0].records
    assert records[1].executed == "skipped" and records[1].fingerprint == ()
    fingerprints = next(v for _, v in result.failed_verdicts()
                        if v.checker == "collective_fingerprints")
    assert "rank 1 issues None" in fingerprints.detail


def test_an_idle_rank_that_runs_its_dummy_eagerly_beside_a_replay_fails_executes_plan():
    config = {"dummy_execution": "eager", "cudagraph_mode": "FULL", "capture_sizes": [8],
              "max_num_reqs": 8, "max_num_batched_tokens": 64}
    result = run(config, [[{"tokens": 8}, {"tokens": 0}]])
    verdict = next(v for _, v in result.failed_verdicts() if v.checker == "executes_plan")
    assert verdict.detail.startswith("rank 1 plans to replay FULL/8tok")
    assert "idle" in verdict.detail
    assert run({**config, "dummy_execution": "agreed"}, [[{"tokens": 8}, {"tokens": 0}]]).ok


def sync_state(config: HarnessConfig, rank: int, batches: list[RankBatch]):
    columns = [local_column(GraphTable.build(config, r), b) for r, b in enumerate(batches)]
    rows = [[column[row] for column in columns] for row in range(len(columns[0]))]
    return decide_from_matrix(config, GraphTable.build(config, rank), rows,
                              batches[rank]).state


@pytest.mark.parametrize("drafts", [1, 2])
def test_the_drafters_sync_state_holds_a_per_rank_count_only_under_the_slip(drafts):
    config = HarnessConfig.of(enable_dbo=False, decode_query_len=drafts, cudagraph_mode="FULL",
                              capture_sizes=(4,), max_num_reqs=4, max_num_batched_tokens=64)
    batches = [RankBatch.from_query_lens([drafts, drafts], True, drafts),
               RankBatch.from_query_lens([drafts], True, drafts)]
    synced = {sync_state(config, r, batches) for r in range(2)}
    assert len(synced) == 1
    slipped = config.with_changes(draft_sync_state="rank-local")
    states = [sync_state(slipped, r, batches) for r in range(2)]
    # Only a step with drafts hands its state to the drafter.
    assert (states[0] != states[1]) == (drafts > 1)


def tagged(records, tags):
    return [replace(r, run_tag=1, received_tags=tuple((0, peer, t) for peer, t in enumerate(
        tags[r.rank]))) for r in records]


def test_fresh_receive_holds_when_every_block_carries_the_runs_tag():
    assert check_fresh_receive(tagged(step_records(2), [[1, 1], [1, 1]])).ok


@pytest.mark.parametrize("rank", [0, 1])
def test_fresh_receive_names_the_rank_and_source_of_a_stale_tag_on_any_rank(rank):
    tags = [[1, 1], [1, 1]]
    tags[rank][1 - rank] = 0
    verdict = check_fresh_receive(tagged(step_records(2), tags))
    assert not verdict.ok
    assert f"rank {rank} (replay) microbatch 0: the block from rank {1 - rank}" in verdict.detail


def test_fresh_receive_does_not_judge_a_step_whose_fault_left_dispatches_unsent():
    records = tagged(step_records(2), [[1, 0], [1, 1]])
    records[0] = replace(records[0], injected_fault=True)
    assert check_fresh_receive(records).outcome is Outcome.NOT_APPLICABLE


def test_a_replay_ships_the_tag_it_was_captured_with_only_when_baked_in():
    config = {"enable_dbo": False, "cudagraph_mode": "FULL", "capture_sizes": [4],
              "max_num_reqs": 4, "max_num_batched_tokens": 64}
    ranks = [[{"tokens": 4}, {"tokens": 4}]] * 2
    clean = run(config, ranks)
    assert clean.ok
    assert {t for r in clean.steps[1].records for _, _, t in r.received_tags} == {2}
    baked = run({**config, "replay_tag": "captured"}, ranks)
    assert {t for r in baked.steps[0].records for _, _, t in r.received_tags} == {0}
    assert "fresh_receive" in failed_checkers(baked)

