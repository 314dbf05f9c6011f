"""Where each real token ran (docs/spec.md §4.1, §8 invariant 33b): in exactly one microbatch
of its rank's split, and one whose request slice holds the token's request. Judged on the
slices each rank recorded running, against the step's input (its requests' query lengths)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate

from harness.check.verdict import Judgement, failed, held, not_applicable
from harness.history.records import Span, StepRecord


def check_tokens_in_their_requests(records: Sequence[StepRecord],
                                   query_lens: Sequence[Sequence[int]]) -> Judgement:
    """Every real token of a split step runs once, inside a microbatch that holds its request."""
    if len(query_lens) != len(records):
        return not_applicable("the step's input was not saved with this run")
    judged = [r for r in records if _split_and_laid_out_as_given(r)]
    if not judged:
        return not_applicable("no rank completed a split step with its tokens where given")
    for rec in judged:
        problem = misplaced_token(rec.ran_split, query_lens[rec.rank])
        if problem is not None:
            return failed(f"rank {rec.rank} ({rec.executed}): {problem}; slices run "
                          f"{list(rec.ran_split)}")
    return held()


def _split_and_laid_out_as_given(rec: StepRecord) -> bool:
    # A staged replay moves its real tokens (§3.4): matches_reference judges those rows.
    staged = rec.plan is not None and rec.plan.state is not None \
        and rec.plan.state.staged_tokens is not None
    return rec.error is None and len(rec.ran_split) > 1 and not staged


def misplaced_token(split: Sequence[Span], query_lens: Sequence[int]) -> str | None:
    """The first real token that runs in no microbatch, in two, or in one whose request
    slice leaves its request out; None when every token is where it belongs."""
    starts = [0, *accumulate(query_lens)]
    total = starts[-1]
    runs_in: list[list[int]] = [[] for _ in range(total)]
    for ubatch, (_, _, tok_start, tok_stop) in enumerate(split):
        for token in range(max(tok_start, 0), min(tok_stop, total)):
            runs_in[token].append(ubatch)
    for token, ubatches in enumerate(runs_in):
        request = bisect_right(starts, token) - 1
        if len(ubatches) != 1:
            return f"token {token} (request {request}) runs in microbatches {ubatches}"
        req_start, req_stop = split[ubatches[0]][:2]
        if not req_start <= request < req_stop:
            return (f"token {token} runs in microbatch {ubatches[0]}, whose requests "
                    f"[{req_start}:{req_stop}] leave out its request {request}")
    return None
