"""Checkers of what each rank ran against what it decided (docs/spec.md §8.6): the graph it
replayed, the slices it split into, the buffers its all-to-alls had, and whether the group
split together. Pure functions over every rank's step records."""

from __future__ import annotations

from collections.abc import Sequence

from harness.check.verdict import Judgement, failed, held, not_applicable
from harness.config import CudaGraphMode
from harness.history.decision import StepPlan
from harness.history.records import StepRecord


def region_spans(plan: StepPlan) -> list[tuple[int, int]]:
    """The token spans of the plan's regions, laid end to end from token 0."""
    starts = [0]
    for region in plan.regions:
        starts.append(starts[-1] + region.tokens)
    return list(zip(starts, starts[1:], strict=False))


NOTHING_RAN = "no rank decided and completed the step: nothing ran to judge"


def _ran(records: Sequence[StepRecord]) -> list[StepRecord]:
    """Ranks that decided and completed the step (a failed rank ran nothing to judge)."""
    return [r for r in records if r.plan is not None and r.error is None]


def check_executes_plan(records: Sequence[StepRecord]) -> Judgement:
    """A FULL descriptor replays that very graph; any other plan runs eagerly, split as the
    plan splits it (a captured graph that is not found must not turn into an eager run); and
    the rank runs the tokens it padded to, an idle rank's dummy batch included (#26137)."""
    if not _ran(records):
        return not_applicable(NOTHING_RAN)
    for rec in _ran(records):
        desc = rec.plan.desc
        ran_tokens = rec.ran_split[-1][3] if rec.ran_split else None
        if ran_tokens is not None and ran_tokens != max(rec.plan.num_tokens, 1):
            idle = " (idle: its dummy batch)" if rec.plan.real_tokens == 0 else ""
            return failed(f"rank {rec.rank}{idle} ran {ran_tokens} tokens "
                         f"({rec.executed}), not the {rec.plan.num_tokens} of its plan "
                         f"{desc.label()}")
        if desc.cg_mode is CudaGraphMode.FULL:
            if rec.executed == "replay" and rec.replayed != desc.label():
                return failed(f"rank {rec.rank} plans to replay {desc.label()} but "
                             f"replayed {rec.replayed}")
            if rec.executed != "replay":
                why = ("its dummy batch, idle, did not replay its peers' graph"
                       if rec.plan.real_tokens == 0
                       else "the graph was not found under its descriptor")
                return failed(f"rank {rec.rank} plans to replay {desc.label()} but ran "
                             f"{rec.executed}: {why}")
            continue
        want = "eager-microbatched" if desc.microbatched else "eager"
        if rec.executed != want:
            return failed(f"rank {rec.rank} plans {rec.plan.kind} ({desc.label()}) but "
                         f"ran {rec.executed}")
    return held()


def check_eager_slices(records: Sequence[StepRecord]) -> Judgement:
    """A split step that replays no graph runs the rank's own requests: its slices tile the
    plan's regions and end at the plan's request count, padding no request (§2.4, §4.3)."""
    if not any(rec.executed == "eager-microbatched" for rec in _ran(records)):
        return not_applicable("no rank ran the step eagerly split")
    for rec in _ran(records):
        if rec.executed != "eager-microbatched":
            continue
        plan = rec.plan
        want_tokens = region_spans(plan)
        got_tokens = [(s[2], s[3]) for s in rec.ran_split]
        if got_tokens != want_tokens:
            return failed(f"rank {rec.rank} ran token slices {got_tokens}, not the "
                         f"regions {want_tokens} of its {plan.num_tokens} padded tokens")
        last = rec.ran_split[-1]
        if last[1] != plan.num_reqs:
            return failed(f"rank {rec.rank} (no graph replayed) ran microbatch slices "
                         f"padded to {last[1]} requests, not its own {plan.num_reqs}: "
                         f"slices {list(rec.ran_split)}")
    return held()


def check_split_consensus(records: Sequence[StepRecord]) -> Judgement:
    """Either every rank splits the step k ways or none does (invariant 3): a rank that
    leaves the split alone meets its peers' extra all-to-alls with nothing."""
    # The microbatches a rank ran; a rank that failed mid-step, those its plan split into.
    ways = {r.rank: len(r.ran_split) if r.error is None and r.ran_split
            else r.plan.desc.num_ubatches for r in records if r.plan is not None}
    if len(ways) < 2:
        return not_applicable(f"{len(ways)} rank(s) decided the step: no split to agree on")
    split = [rank for rank, n in ways.items() if n > 1]
    whole = [rank for rank, n in ways.items() if n == 1]
    if not split or not whole:
        return held()
    k = max(ways.values())
    # Name the smaller group (the unsplit one on a tie): that is the rank that left alone.
    if len(split) < len(whole):
        return failed(f"ranks {split} split the step {k} ways alone; ranks {whole} run "
                     "it unsplit")
    return failed(f"ranks {whole} opted out of microbatching alone: they run the step "
                 f"unsplit while ranks {split} split it {k} ways")


def check_dispatch_capacity(records: Sequence[StepRecord]) -> Judgement:
    """Every microbatch a rank runs (the whole step when unsplit) fits the all-to-all
    buffers it has: they are sized for the largest batch, not for one microbatch of it."""
    sized = [r for r in records if r.plan is not None and r.a2a_tokens_per_rank is not None]
    if not sized:
        return not_applicable("no rank that decided the step recorded its all-to-all "
                              "buffers' capacity")
    for rec in sized:
        plan = rec.plan
        largest = (max(r.tokens for r in plan.regions) if plan.regions
                   else max(plan.num_tokens, 1))  # an idle rank still sends one padding token
        if largest > rec.a2a_tokens_per_rank:
            what = "a microbatch" if plan.regions else f"its {plan.kind} step"
            return failed(f"rank {rec.rank} runs {what} of {largest} tokens through "
                         f"all-to-all buffers that take {rec.a2a_tokens_per_rank} tokens "
                         "per rank")
    return held()


def check_fresh_receive(records: Sequence[StepRecord]) -> Judgement:
    """Every block a rank's dispatches delivered carries this run's readiness tag: a tag of
    an earlier run is stale data a receiver would take as fresh (docs/spec.md §7.23)."""
    if any(r.injected_fault for r in records):
        return not_applicable("a fault leaves dispatches unsent by design")
    tagged = [r for r in _ran(records) if r.run_tag is not None and r.received_tags]
    if not tagged:
        return not_applicable("no run tagged its dispatches")
    for rec in tagged:
        for ubatch, source, tag in rec.received_tags:
            if tag != rec.run_tag:
                return failed(f"rank {rec.rank} ({rec.executed}) microbatch {ubatch}: the "
                             f"block from rank {source} carries readiness tag {tag}, not this "
                             f"run's {rec.run_tag}: an earlier run's, taken as fresh")
    return held()
