"""The DP sync over real gloo groups, one thread per rank: the path the worlds run."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.batch import RankBatch
from harness.config import HarnessConfig
from harness.gen.strategies import configs, steps
from harness.runtime.comm import CollectiveTimeout, all_reduce_sum
from harness.sut.step_plan import decide_on_rank, plan_without_world
from harness.world.sim.threads import RankFailure, RankHang, ThreadWorld, run_in_threads

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def world(nproc):
    with ThreadWorld(nproc, timeout_s=10.0) as w:
        yield w


def test_the_all_reduce_gathers_every_rank_column(world):
    import torch

    def column(rank, group):
        matrix = torch.zeros(2, world.size, dtype=torch.int32)
        matrix[:, rank] = torch.tensor([rank + 1, 10 * (rank + 1)])
        return all_reduce_sum(group, matrix, 5.0).tolist()

    expected = [[r + 1 for r in range(world.size)], [10 * (r + 1) for r in range(world.size)]]
    assert world.run(column) == [expected] * world.size


@settings(max_examples=25)
@given(data=st.data())
def test_ranks_over_gloo_decide_exactly_what_the_gathered_matrix_decides(world, data):
    config, batches = data.draw(steps(configs(dp_sizes=(world.size,))))
    plans = world.run(lambda rank, group: decide_on_rank(group, config, rank, batches[rank], 5.0))
    assert plans == plan_without_world(config, batches)


def test_a_rank_that_skips_the_sync_makes_its_peers_fail_within_the_group_timeout(nproc):
    config = HarnessConfig.of(dp_size=nproc)
    batch = RankBatch.uniform(64, 1)

    def rank_code(rank, group):
        if rank == nproc - 1:
            return None  # skips the collective
        return decide_on_rank(group, config, rank, batch, timeout_s=1.0)

    start = time.monotonic()
    with ThreadWorld(nproc, timeout_s=1.0) as skipping_world, \
            pytest.raises(RankFailure) as failure:
        skipping_world.run(rank_code, deadline_s=10.0)
    assert time.monotonic() - start < 8.0
    assert sorted(failure.value.errors) == list(range(nproc - 1))
    assert all(isinstance(e, CollectiveTimeout) for e in failure.value.errors.values())
    assert str(failure.value).startswith("rank 0 failed: CollectiveTimeout")


def test_a_rank_stuck_past_the_deadline_is_reported_as_a_hang_naming_it():
    release = threading.Event()

    def rank_code(rank):
        if rank == 1:
            release.wait(5.0)
        return rank

    try:
        with pytest.raises(RankHang) as hang:
            run_in_threads(2, rank_code, deadline_s=0.3)
        assert hang.value.ranks == [1]
    finally:
        release.set()
