"""A dead rank's slot never enters an agreement (docs/spec.md §1.7, §8 invariant 33c).

Once some live rank has been told a DP rank is dead, every live rank decides over the live
columns alone. The judge tells the two apart by what each live rank decided: the plan the
live columns give, or the plan the dead rank's zero column gives (its graph-mode vote reads
NONE, its tokens 0, its microbatching vote 0). A dead rank's own record is the world's silent
member (harness/dead_ranks.py), not the system's, and is not judged.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.check.verdict import Judgement, failed, held, not_applicable
from harness.history.decision import StepPlan
from harness.history.records import StepRecord


def check_dead_slots_left_out(records: Sequence[StepRecord], dead: Sequence[int],
                              known_dead: Sequence[int],
                              expected: Sequence[StepPlan] | None,
                              keeping_dead: Sequence[StepPlan] | None) -> Judgement:
    """Each live rank's agreement is the one over live columns, never the one a known dead
    rank's zero column gives. `expected`: per rank, the plan over live columns; `keeping_dead`:
    the plan with every dead column kept."""
    if not known_dead:
        why = "no rank is dead at this step" if not dead else \
            f"no live rank has been told that rank(s) {sorted(dead)} died"
        return not_applicable(why)
    if expected is None or keeping_dead is None:
        return not_applicable("the plans over live columns were not computed for this run")
    live = [r for r in records if r.rank not in dead and r.plan is not None]
    if not live:
        return not_applicable("no live rank completed its DP sync")
    told = [r for r in live
            if expected[r.rank].agreement_key() != keeping_dead[r.rank].agreement_key()]
    if not told:
        return not_applicable(f"rank(s) {sorted(known_dead)}'s zero column changes no live "
                              "rank's decision at this step")
    for rec in told:
        got = rec.plan.agreement_key()
        if got == keeping_dead[rec.rank].agreement_key() != expected[rec.rank].agreement_key():
            return failed(f"rank {rec.rank} agreed over dead rank(s) {sorted(known_dead)}'s "
                          f"zero column: {_summary(rec.plan)}; the live columns give "
                          f"{_summary(expected[rec.rank])}")
    return held(f"{len(told)} live rank(s) left rank(s) {sorted(known_dead)} out")


def _summary(plan: StepPlan) -> str:
    desc = plan.desc
    return f"{desc.cg_mode.name} x{desc.num_ubatches} at {desc.num_tokens} tokens"
