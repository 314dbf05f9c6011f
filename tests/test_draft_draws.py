"""The draws of draft tokens (harness/gen/drafts.py): configs drawn for their drafts, the mode
varlen graphs get, the decode-beside-prefill step, and the reference search reaching a slip
in the synced query-length bound (docs/spec.md §1.6, §7.17) within a bounded number of draws."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from harness.batch import RankBatch
from harness.bench.reach import drawn_examples
from harness.check.agreement import first_disagreement
from harness.config import CudaGraphMode, HarnessConfig, Mutation
from harness.gen.drafts import decode_beside_prefill, draft_layout
from harness.gen.reach import at_draft_bound
from harness.gen.strategies import fuzz_configs
from harness.scenario import Scenario
from harness.sut.step_plan import plan_without_world

VARLEN = HarnessConfig.of(dp_size=3, enable_dbo=False, decode_query_len=3, varlen_decode=True,
                          cudagraph_mode="FULL_AND_PIECEWISE", capture_sizes=(8, 16),
                          max_num_reqs=8, max_num_batched_tokens=64)
QUICK = settings(max_examples=60, database=None, deadline=None,
                 suppress_health_check=list(HealthCheck))


@QUICK
@given(st.data())
def test_a_config_drawn_for_its_drafts_has_draft_tokens_and_varlen_ones_pad_mixed_steps(data):
    config = data.draw(fuzz_configs({}, dp_sizes=(2,), drafts_every=1))
    assert config.serving.decode_query_len >= 2
    if not config.serving.release.spec_decode_with_dbo:  # 0.33 drafts only unsplit
        assert config.num_ubatches == 1
    if config.serving.varlen_decode:
        assert config.serving.cudagraph_mode is CudaGraphMode.FULL_AND_PIECEWISE


def test_drafts_are_drawn_beside_microbatching_on_0_34_and_never_on_0_33():
    # Over four seeds of the plain reference configs, not one (issue 44 item 8): hits cluster,
    # one seed drew none in its 300; seeds 0-3 drew 64 (2026-12-06).
    split_drafts = {"0.33": 0, "0.34": 0}

    @settings(max_examples=300, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(fuzz_configs({}, dp_sizes=(2,)))
    def count(config):
        if config.num_ubatches > 1 and config.serving.decode_query_len > 1:
            split_drafts[config.serving.release.value] += 1

    for seed in range(4):
        hypothesis_seed(seed)(count)()
    assert split_drafts["0.33"] == 0
    assert split_drafts["0.34"] >= 32, split_drafts


@QUICK
@given(st.data())
def test_a_pinned_mode_is_kept_beside_varlen_decode_graphs(data):
    config = data.draw(fuzz_configs({"cudagraph_mode": "FULL_DECODE_ONLY",
                                     "varlen_decode": True}, dp_sizes=(2,), drafts_every=1))
    assert config.serving.cudagraph_mode is CudaGraphMode.FULL_DECODE_ONLY


@QUICK
@given(st.data())
def test_a_prefill_beside_decodes_within_one_varlen_graph_is_always_at_the_draft_bound(data):
    shaped = data.draw(decode_beside_prefill(VARLEN))
    layouts = [layout for _, layout in shaped]
    assert len(shaped) == 3 and "prefill" in layouts and set(layouts) - {"prefill"}
    batches = tuple(RankBatch.from_query_lens(draft_layout(VARLEN, n, layout, data.draw),
                                              decode_query_len=3) for n, layout in shaped)
    assert max(b.num_tokens for b in batches) <= 16
    assert at_draft_bound(Scenario(VARLEN, (batches,)))


@pytest.mark.parametrize("changes", [
    {"dp_size": 1},  # no peer to sit beside
    {"capture_sizes": (3,)},  # no size holds a prefill (more than q tokens)
    {"capture_sizes": (32,), "max_num_reqs": 8},  # 32 > 8 * 3: no varlen graph of that size
])
def test_no_decode_beside_prefill_step_is_drawn_where_the_config_leaves_none(changes):
    config = replace(VARLEN, serving=replace(VARLEN.serving, **changes))

    @QUICK
    @given(decode_beside_prefill(config))
    def draw(shaped):
        assert shaped == []

    draw()


def _shows_rank_local_bound(scenario: Scenario) -> bool:
    """The ranks disagree once their dispatch takes each rank's own bound (§7.17's slip)."""
    config = replace(scenario.config, mutation=Mutation(query_len_bound="rank-local"))
    return any(first_disagreement(plan_without_world(config, scenario.batches(i))) is not None
               for i in range(len(scenario.steps)))


def test_the_reference_search_reaches_a_slip_in_the_draft_bound_in_four_hundred_examples():
    # Summed over four seeds of 100 (hits cluster: one seed alone may draw none); before the
    # draws leaned toward it, three of these four seeds drew none. Measured: 0, 12, 8, 23.
    drawn = [s for seed in range(4) for s in drawn_examples(100, seed)]
    assert sum(_shows_rank_local_bound(s) for s in drawn) >= 10
    assert all(first_disagreement(plan_without_world(s.config, s.batches(i))) is None
               for s in drawn for i in range(len(s.steps)))  # the reference itself agrees
