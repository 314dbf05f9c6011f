"""Checkers of start-up (docs/spec.md §8.2): capture finished on every rank, left no thread
or pending run, and every graph it holds recorded work, lines up across ranks and can be
replayed by some legal batch. Pure functions over every rank's start-up record (and,
for reach, the config the spec judges it by)."""

from __future__ import annotations

from collections.abc import Sequence

from harness.check.verdict import Judgement, failed, held, not_applicable
from harness.config import HarnessConfig
from harness.history.decision import descriptor_of_label
from harness.history.records import StartupRecord
from harness.spec.decision import reached

NO_GRAPH = "no rank captured a graph"


def check_capture_finished(records: Sequence[StartupRecord | None],
                           deadline_s: float) -> Judgement:
    """Every rank finished capture within its deadline, without an error."""
    stuck = [r for r, rec in enumerate(records) if rec is None]
    if stuck:
        return failed(f"ranks {stuck} did not finish capture within {deadline_s:.1f} s")
    broken = [rec for rec in records if rec.error is not None]
    if broken:
        return failed(f"rank {broken[0].rank}: {broken[0].error.describe()}")
    return held()


def check_capture_hygiene(records: Sequence[StartupRecord]) -> Judgement:
    """After capture no microbatch thread lives and no run is pending."""
    dirty = [rec for rec in records if rec.threads_alive or rec.pending_run]
    if dirty:
        return failed(f"rank {dirty[0].rank}: threads {list(dirty[0].threads_alive)} alive, "
                      f"pending run {dirty[0].pending_run} after capture")
    return held()


def check_graphs_capture_work(records: Sequence[StartupRecord]) -> Judgement:
    """Every captured graph recorded work (a graph captured on a stream its work never ran
    on records nothing)."""
    if not any(rec.graphs for rec in records):
        return not_applicable(NO_GRAPH)
    empty = [(rec.rank, g.label) for rec in records for g in rec.graphs if g.empty]
    if empty:
        return failed(f"rank {empty[0][0]}: graph {empty[0][1]} recorded nothing (captured "
                      "on a stream its work never ran on)")
    return held()


def check_capture_symmetry(records: Sequence[StartupRecord]) -> Judgement:
    """Every rank plans the same graphs in the same order: they are captured with
    collectives inside, so capture lines up only then."""
    if len(records) < 2:
        return not_applicable("one rank: no other rank's capture to line up with")
    first = records[0]
    differ = [rec.rank for rec in records if rec.planned != first.planned]
    if differ:
        only = sorted(set(records[differ[0]].planned) ^ set(first.planned))
        return failed(f"ranks {differ} plan other graphs than rank {first.rank} (they are "
                      "captured with collectives inside, so capture cannot line up): "
                      f"{', '.join(only) or 'another order'}")
    return held()


def check_graphs_reachable(records: Sequence[StartupRecord],
                           config: HarnessConfig) -> Judgement:
    """Every rank holds only graphs some legal batch replays (ranks may hold other tables).
    Reach is docs/spec.md §2.2 rule 3 over the graphs the record says were captured, never
    the rank's own `reached_by`: a saved run is judged again from its labels alone."""
    if not any(rec.graphs for rec in records):
        return not_applicable(NO_GRAPH)
    for rec in records:
        try:
            captured = [descriptor_of_label(g.label) for g in rec.graphs]
        except ValueError as exc:
            return failed(f"rank {rec.rank}: {exc}")
        # An unsplit graph is replayed by a batch of its size that may not split (§2.2).
        unreachable = [g for g, desc in zip(rec.graphs, captured, strict=True)
                       if desc.microbatched and not reached(config, captured, desc)]
        if unreachable:
            wasted = sum(g.bytes for g in unreachable)
            names = ", ".join(g.label for g in unreachable)
            return failed(f"rank {rec.rank}: {len(unreachable)} graph(s) no legal batch can "
                          f"replay, holding {wasted} bytes of buffers: {names}")
    return held()
