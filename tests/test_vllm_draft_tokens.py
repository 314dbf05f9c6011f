"""Draft tokens with vLLM's own decision code in the slots (docs/spec.md §1.6): its candidates
with decode_query_len > 1 and varlen decode graphs, its dispatch by the query-length bound,
its skip_drafts row, and a rank-local bound planted in its dp_utils, found by differential.

Skipped where vLLM does not import."""

from __future__ import annotations

import itertools

import pytest
from vllm_releases import SHIPS_THE_KNOWN_BUGS, config_of, release_patch, ships_the_known_bugs

from harness.batch import RankBatch
from harness.config import HarnessConfig
from harness.fuzz.engine import FUZZ_TIMEOUTS, Budget, fuzz
from harness.fuzz.variants import SUT_VARIANTS
from harness.sut.graph_table import GraphTable
from harness.sut.step_plan import plan_without_world
from harness.vllm_sut.available import installed_release, unavailable_reason, vllm_version
from harness.world.sim.world import SimWorld

if vllm_version() is None:
    pytest.skip(unavailable_reason(), allow_module_level=True)

from harness.vllm_sut.candidates import vllm_capture_order, vllm_dispatch
from harness.vllm_sut.offline import vllm_plans_without_world

known_bugs = pytest.mark.skipif(not ships_the_known_bugs(), reason=f"pins bugs that "
                                f"{SHIPS_THE_KNOWN_BUGS} ship, this is {vllm_version()}")
PATCH = release_patch("rank-local-query-len-bound.diff")  # against the installed release

CONFIGS = [config_of(enable_dbo=False, decode_query_len=q, varlen_decode=varlen,
                            cudagraph_mode=mode, capture_sizes=sizes, max_num_reqs=reqs,
                            max_num_batched_tokens=64)
           for q, varlen, mode, sizes, reqs in itertools.product(
               (2, 3, 4), (False, True), ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "FULL"),
               ((4, 12), (8, 16, 48)), (3, 8, 64))]


def name(config: HarnessConfig) -> str:
    s = config.serving
    return (f"q{s.decode_query_len}-{'varlen' if s.varlen_decode else 'uniform'}-"
            f"{s.cudagraph_mode.name}-{'.'.join(map(str, s.capture_sizes))}-"
            f"r{s.max_num_reqs}")


@pytest.mark.parametrize("config", CONFIGS, ids=name)
def test_vllm_captures_the_draft_graph_tables_descriptors_in_the_same_order(config):
    ours = [d.label() for d in GraphTable.build(config).capture_order()]
    theirs = [d.label() for d in vllm_capture_order(config)]
    assert ours == theirs


def layouts(q: int, tokens: int, limit: int):
    """Decode layouts of 1..q tokens per request, a uniform one, and one with a prefill."""
    for reqs in range(-(-tokens // q), min(tokens, limit) + 1):
        base, extra = divmod(tokens, reqs)
        yield (base,) * (reqs - extra) + (base + 1,) * extra
    yield (tokens,)  # a prefill when tokens > q


@pytest.mark.parametrize("config", [c for c in CONFIGS if c.serving.max_num_reqs != 64], ids=name)
def test_vllm_dispatches_every_draft_batch_like_the_graph_table(config):
    table = GraphTable.build(config)
    q = config.serving.decode_query_len
    mismatches = []
    for tokens in range(1, 50):
        for lens in layouts(q, tokens, config.serving.max_num_reqs):
            b = RankBatch.from_query_lens(lens, decode_query_len=q)
            args = (b.num_reqs, b.num_tokens, b.uniform_token_count, b.max_query_len)
            ours, theirs = table.dispatch(*args), vllm_dispatch(config, *args)
            if ours != theirs:
                mismatches.append(f"{lens}: harness {ours.label()}, vllm {theirs.label()}")
    assert not mismatches, "\n".join(mismatches[:20])


def agreed(state):
    return (state.num_tokens_across_dp, state.uniform_token_count, state.eager,
            state.skip_drafts)


@pytest.mark.parametrize("skips", [(True, True, True), (True, True, False), (False, True, True)])
def test_vllm_syncs_the_query_len_bound_and_skip_drafts_as_the_harness_does(skips):
    config = config_of(dp_size=3, enable_dbo=False, decode_query_len=3, varlen_decode=True,
                              cudagraph_mode="FULL_AND_PIECEWISE", capture_sizes=(8, 16),
                              max_num_reqs=8, max_num_batched_tokens=64)
    for lens in (((1, 3, 2), (2, 1), ()), ((1, 3, 2), (5, 1), (3,)), ((3, 3), (3,), (3, 3))):
        batches = [RankBatch.from_query_lens(ls, decode_query_len=3, allow_skip_drafts=s)
                   for ls, s in zip(lens, skips, strict=True)]
        ours = plan_without_world(config, batches)
        theirs = vllm_plans_without_world(config.with_changes(sut="vllm"), batches)
        # num_reqs left out: vLLM 0.33.0 syncs the most real requests, the harness the graph's.
        assert [agreed(p.state) for p in theirs] == [agreed(p.state) for p in ours]
        assert [p.desc for p in theirs] == [p.desc for p in ours]
        assert {p.state.skip_drafts for p in ours} == {all(skips)}


@known_bugs
def test_a_rank_local_bound_in_vllms_dp_utils_is_found_by_differential_within_30_examples(
        tmp_path):
    fixed = {"enable_dbo": False, "ubatch_size": 0, "vllm_patches": (PATCH,),
             "release": installed_release().value}
    # Seeded and bounded by world runs, not seconds, its shrink too (87 runs on 2026-12-06):
    # a fixed path (found at the 3rd run), however slow the machine.
    with SimWorld(2, FUZZ_TIMEOUTS) as world:
        outcome = fuzz(SUT_VARIANTS["vllm"], world.run, world="sim", dp_sizes=(2,), fixed=fixed,
                       budget=Budget(examples=30, seconds=None, shrink_examples=150,
                                     shrink_seconds=120.0),
                       database=None, scenario_dir=tmp_path, seed=0)
    assert outcome.found and outcome.checker == "differential", outcome.note
    assert "mql" in outcome.detail  # a varlen decode graph against the reference's choice
    steps = outcome.scenario.steps
    assert len(steps) == 1 and len(steps[0]) == 2  # shrunk to one step of two ranks
