"""The collective log holds what each rank passed to each collective, as it passed it: a
rank that sends another shape or dtype differs in its fingerprint."""

from __future__ import annotations

import torch

from harness.batch import RankBatch
from harness.config import HarnessConfig
from harness.runtime.comm import CollectiveLog, all_reduce_sum
from harness.scenario import scenario_from_dict
from harness.sut.dp_sync import NUM_ROWS, sync_dp
from harness.sut.step_plan import graph_table_for
from harness.world.sim.world import SimWorld


class DoneWork:
    def wait(self, timeout) -> bool:
        return True


class LoneGroup:
    """A group whose all-reduce returns at once (the tensor keeps this rank's column)."""

    def allreduce(self, tensors) -> DoneWork:
        return DoneWork()


def test_the_all_reduce_is_logged_with_the_tensor_each_rank_passed():
    logs = [CollectiveLog() for _ in range(3)]
    for rank, log in enumerate(logs):
        dtype = torch.int64 if rank == 2 else torch.int32
        all_reduce_sum(LoneGroup(), torch.zeros(NUM_ROWS, 3, dtype=dtype), 1.0, log)
    assert logs[0].since(0) == logs[1].since(0) == (("all_reduce", (NUM_ROWS, 3), "int32"),)
    assert logs[2].since(0) == (("all_reduce", (NUM_ROWS, 3), "int64"),)


def test_the_dp_sync_logs_the_matrix_it_reduces():
    config = HarnessConfig.of(dp_size=3, capture_sizes=(16,), max_num_reqs=16,
                              max_num_batched_tokens=16, decode_threshold=2, prefill_threshold=4)
    log = CollectiveLog()
    sync_dp(LoneGroup(), config, graph_table_for(config, 0), 0, RankBatch.uniform(4, 1), 1.0,
            log)
    assert log.since(0) == (("all_reduce", (NUM_ROWS, 3), "int32"),)


def test_every_step_record_starts_with_the_sync_as_the_rank_issued_it():
    scenario = scenario_from_dict({
        "config": {"capture_sizes": [16], "max_num_reqs": 16, "max_num_batched_tokens": 16,
                   "decode_threshold": 2, "prefill_threshold": 4},
        "steps": [{"ranks": [4, 8]}, {"ranks": [1, 0]}]})
    with SimWorld(2) as world:
        history = world.run(scenario)
    for records in history.steps:
        for rec in records:
            assert rec.fingerprint[0] == ("all_reduce", (NUM_ROWS, 2), "int32"), rec
