"""The reference search, unsteered, reaching where two planted bugs show (issue 44 item 8):
the window of a guard with a literal 2 (k >= 3, a twin of G tokens, the smallest rank above
G / 2 yet at or below the last region start) and drafts trimmed by adaptive verification in a
split step, where the untrimmed counts cut the requests elsewhere (docs/spec.md §7.24). Both
are counted over several seeds of the search's own draws, never one."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from hypothesis import HealthCheck, given, settings

from harness.bench.reach import drawn_examples
from harness.config import HarnessConfig, Mutation
from harness.gen.aim import straddled_graphs
from harness.gen.strategies import straddling_token_counts
from harness.scenario import Scenario
from harness.sut.slicing import clamped_ubatch_slices, split_uct_of
from harness.sut.step_plan import plan_without_world

# About what a reference search runs in 40 s on the sim world; hits cluster (the search
# mutates around one), so a seed alone may draw none.
SEEDS, EXAMPLES = range(4), 150


@cache
def _drawn() -> tuple[tuple[Scenario, ...], ...]:
    return tuple(tuple(drawn_examples(EXAMPLES, seed)) for seed in SEEDS)


def _literal_two_guard_plans_otherwise(scenario: Scenario) -> bool:
    """Some step the guard `2 * min <= G` plans otherwise than the fixed guard."""
    bug = replace(scenario.config, mutation=Mutation(guard="strict-k2"))
    for i in range(len(scenario.steps)):
        batches = scenario.batches(i)
        if not any(b.dead for b in batches) and (
                [p.desc for p in plan_without_world(scenario.config, batches)]
                != [p.desc for p in plan_without_world(bug, batches)]):
            return True
    return False


def _untrimmed_counts_cut_elsewhere(scenario: Scenario) -> bool:
    """A rank with trimmed drafts in a split step whose request slices differ when cut by
    the scheduled (untrimmed) counts instead of the tokens that run."""
    config = scenario.config
    for i in range(len(scenario.steps)):
        batches = scenario.batches(i)
        for batch, plan in zip(batches, plan_without_world(config, batches), strict=True):
            if batch.dead or not batch.scheduled_lens or not plan.desc.microbatched:
                continue
            cut = (plan.num_tokens, plan.num_reqs, plan.desc.num_ubatches,
                   split_uct_of(config, plan.desc, plan.state))
            ran = clamped_ubatch_slices(batch.request_query_lens(), *cut)
            scheduled = clamped_ubatch_slices(batch.scheduled_lens, *cut)
            if [(s.req_start, s.req_stop) for s in ran] != \
                    [(s.req_start, s.req_stop) for s in scheduled]:
                return True
    return False


def test_the_reference_search_reaches_the_window_of_a_literal_two_guard_on_most_seeds():
    # Measured on seeds 0-3: 3, 1, 12, 12 (2026-12-06), once straddles aimed at the twins
    # and laid out as the decodes twins replay; the literal-2 guard then missed no seed of 3.
    hits = [sum(map(_literal_two_guard_plans_otherwise, drawn)) for drawn in _drawn()]
    assert sum(hits) >= 12 and sum(h > 0 for h in hits) >= 3, hits


def test_the_reference_search_reaches_trimmed_drafts_the_untrimmed_counts_cut_elsewhere():
    # Measured on seeds 0-3: 7, 11, 5, 4 (2026-12-06); at most 9 in 200 per seed before
    # verified layouts ran their count and microbatched 0.34 configs drafted one in four.
    hits = [sum(map(_untrimmed_counts_cut_elsewhere, drawn)) for drawn in _drawn()]
    assert sum(hits) >= 14 and sum(h > 0 for h in hits) >= 3, hits


# 0.34's decode twins sit at the request limit: 24 tokens, below both capture sizes.
OFF_SIZES = HarnessConfig.of(dp_size=3, release="0.34", enable_dbo=False, ubatch_size=3,
                             cudagraph_mode="FULL_DECODE_ONLY", capture_sizes=(32, 48),
                             max_num_reqs=24, max_num_batched_tokens=64, decode_threshold=4,
                             prefill_threshold=16)


def test_a_straddle_pads_to_a_twin_the_config_captures_off_its_capture_sizes():
    assert straddled_graphs(OFF_SIZES) == (24,)
    at_twin_edge, draws = 0, 0

    @settings(max_examples=200, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(straddling_token_counts(OFF_SIZES))
    def count(counts):
        nonlocal at_twin_edge, draws
        draws += 1
        # Every rank within the twin, the smallest by its last region start (16).
        at_twin_edge += max(counts) <= 24 and abs(min(counts) - 16) <= 1

    count()
    assert at_twin_edge >= draws / 2, (at_twin_edge, draws)
