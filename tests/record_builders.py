"""Records of a step and a start-up on which every checker holds, for checker tests to break
one field at a time: every rank replays the 32-token graph split in two."""

from __future__ import annotations

from harness.batch import RankBatch
from harness.check.reference import ReferenceRows
from harness.config import HarnessConfig
from harness.history.records import GraphRecord, StartupRecord, StepRecord
from harness.sut.step_plan import plan_without_world

DEADLINE_S = 5.0
ROWS = ((1.0, 2.0), (3.0, 4.0))
STATE = ((0.5, 0.5), (0.0, 0.0))  # one real slot, then the scratch slot
SPLIT = ((0, 16, 0, 16), (16, 32, 16, 32))
FINGERPRINT = (("all_reduce", (7, 4), "int32"), ("all_to_all", (258, 19), "float64"))


def config(ranks: int) -> HarnessConfig:
    return HarnessConfig.of(dp_size=ranks, capture_sizes=(16, 32), max_num_reqs=32,
                            max_num_batched_tokens=64, decode_threshold=8, prefill_threshold=16)


def plans(ranks: int):
    # Every rank above the threshold: all replay the 32-token graph split in two.
    return plan_without_world(config(ranks), [RankBatch.uniform(20 + r, 1)
                                              for r in range(ranks)])


def routes(rank: int) -> tuple[tuple[int, int, int], ...]:
    return ((rank, 0, 2 * rank), (rank, 1, 2 * rank + 1))


def step_records(ranks: int) -> list[StepRecord]:
    return [StepRecord(rank=p.rank, step=0, plan=p, executed="replay", captured_split=SPLIT,
                       replay_split=SPLIT, fingerprint=FINGERPRINT, routes=routes(p.rank),
                       outputs=ROWS, state=STATE, threads_alive=(), pending_run=False,
                       error=None, injected_fault=False, seconds=0.01,
                       replayed=p.desc.label(), ran_split=SPLIT, a2a_tokens_per_rank=64)
            for p in plans(ranks)]


def reference(ranks: int, judged_plans=None) -> ReferenceRows:
    return ReferenceRows((ROWS,) * ranks, (STATE,) * ranks,
                         tuple(routes(r) for r in range(ranks)), judged_plans)


def startup_records(ranks: int) -> list[StartupRecord]:
    graph = GraphRecord("FULL/32tok/32req/uct1/ub2", 2, False, FINGERPRINT, 4096, 32)
    return [StartupRecord(r, (graph.label,), (graph,), None, (), False, 0.5)
            for r in range(ranks)]
