"""Adaptive verification's layouts (docs/spec.md §1.6, §7.24): a step whose draft budget is
below the drafts scheduled runs fewer tokens than it scheduled.

vLLM 0.34 picks the budget on the host (AdaptiveVerificationManager.get_num_tokens, from cost
tables it profiles on the GPU) and hands it out on the GPU (`reallocate_drafts`), draft by
draft in order of survival probability, the product of a request's draft confidences up to that
draft. The harness has no drafter and no GPU cost model, so this is the stand-in, named here and
nowhere else: the budget is drawn, and `admitted_drafts` hands it out by the same rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from hypothesis import strategies as st

from harness.config import HarnessConfig

CONFIDENCES = (0.3, 0.6, 0.9, 1.0)


def admitted_drafts(drafts: Sequence[int], budget: int,
                    confidences: Sequence[Sequence[float]]) -> tuple[int, ...]:
    """How many drafts each request keeps: the `budget` drafts of highest survival
    probability, ties to the earlier request and draft. Survival never grows along a
    request's drafts, so each request keeps a prefix of its own."""
    scored = [(-prod(confidences[r][:step + 1]), r, step)
              for r, count in enumerate(drafts) for step in range(count)]
    kept = [0] * len(drafts)
    for _, r, _ in sorted(scored)[:max(0, budget)]:
        kept[r] += 1
    return tuple(kept)


@st.composite
def verified_layout(draw, config: HarnessConfig, num_tokens: int
                    ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(query lengths run, lengths scheduled) of decodes running `num_tokens` in all, that
    drafted up to q - 1 tokens each, with a budget that trimmed at least one draft; None where
    no such batch fits. The count is what the rank runs, what the DP sync and the split see,
    so that a skew shape's count holds for it too; the trimmed drafts come on top of it."""
    q, serving = config.serving.decode_query_len, config.serving
    room = serving.max_num_batched_tokens - num_tokens  # the scheduled step fits the limit
    least, most = num_tokens // q + 1, min(serving.max_num_reqs, num_tokens)
    if q < 2 or num_tokens < 1 or room < 1 or least > most:
        return None
    reqs = draw(st.integers(least, most))
    budget = num_tokens - reqs  # the drafts that run
    drafts = [draw(st.integers(1, q - 1)) for _ in range(reqs)]
    while sum(drafts) <= budget:  # one draft at least is trimmed
        drafts[drafts.index(min(drafts))] += 1
    while sum(drafts) > budget + room:
        drafts[drafts.index(max(drafts))] -= 1
    confidences = [[draw(st.sampled_from(CONFIDENCES)) for _ in range(d)] for d in drafts]
    kept = admitted_drafts(drafts, budget, confidences)
    return tuple(1 + k for k in kept), tuple(1 + d for d in drafts)
