"""Draft tokens in the harness's own system (docs/spec.md §1.6): decode_query_len > 1 without
microbatching, varlen decode graphs, the synced query-length bound, the skip_drafts row, and
the checkers that hold them on every rank."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.batch import RankBatch
from harness.check.agreement import first_disagreement
from harness.check.checkers import check_differential, check_spec_decision
from harness.check.judge import judge
from harness.config import CudaGraphMode, HarnessConfig
from harness.errors import ConfigError
from harness.fuzz.engine import FUZZ_TIMEOUTS, Budget, fuzz
from harness.fuzz.variants import VARIANTS
from harness.gen.strategies import draft_batches, fuzz_configs
from harness.history.records import StepRecord
from harness.scenario import Scenario, load_scenario, scenario_from_dict
from harness.spec.decision import graph_table, spec_plans
from harness.sut.dp_sync import decide_from_matrix, gathered_rows
from harness.sut.graph_table import GraphTable
from harness.sut.step_plan import plan_without_world
from harness.world.sim.world import SimWorld

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def drafts(dp: int = 2, **changes) -> HarnessConfig:
    fields = {"dp_size": dp, "enable_dbo": False, "decode_query_len": 3, "varlen_decode": True,
              "cudagraph_mode": "FULL_AND_PIECEWISE", "capture_sizes": (8, 16),
              "max_num_reqs": 8, "max_num_batched_tokens": 64}
    return HarnessConfig.of(**{**fields, **changes})


def batch(lens, skip: bool = False, q: int = 3) -> RankBatch:
    return RankBatch.from_query_lens(lens, decode_query_len=q, allow_skip_drafts=skip)


# -- config ---------------------------------------------------------------------------------

def test_draft_tokens_with_microbatching_are_refused_on_0_33_naming_the_field_and_legal_on_0_34():
    assert drafts().serving.decode_query_len == 3
    with pytest.raises(ConfigError) as error:
        HarnessConfig.of(decode_query_len=2, release="0.33")  # DBO is on by default
    assert error.value.field == "decode_query_len"
    assert "speculative decoding with DBO" in str(error.value)
    with pytest.raises(ConfigError) as error:
        HarnessConfig.of(enable_dbo=False, ubatch_size=3, decode_query_len=2, release="0.33")
    assert error.value.field == "decode_query_len"
    assert HarnessConfig.of(decode_query_len=2).num_ubatches == 2  # 0.34, the default
    assert HarnessConfig.of(enable_dbo=False, ubatch_size=3, decode_query_len=4,
                            varlen_decode=True).num_ubatches == 3


@pytest.mark.parametrize("changes, field", [
    ({"decode_query_len": 1}, "varlen_decode"),  # varlen decode graphs serve drafts only
    ({"varlen_decode": "yes"}, "varlen_decode"),
    ({"decode_query_len": 0}, "decode_query_len"),
    ({"query_len_bound": "own"}, "query_len_bound"),
])
def test_a_bad_draft_field_is_refused_naming_it(changes, field):
    with pytest.raises(ConfigError) as error:
        drafts(**changes)
    assert error.value.field == field


def test_a_config_without_drafts_writes_none_of_their_fields():
    assert not {"decode_query_len", "varlen_decode", "query_len_bound"} & set(
        HarnessConfig().to_dict())
    data = drafts().to_dict()
    assert (data["decode_query_len"], data["varlen_decode"]) == (3, True)
    assert HarnessConfig.from_dict(data) == drafts()


# -- graph table and dispatch ---------------------------------------------------------------

@pytest.mark.parametrize("release, varlen_graphs", [
    # 0.33: one varlen graph per capture size up to max_num_reqs * q = 12 tokens.
    ("0.33", ["FULL/8tok/4req/mql3"]),
    # 0.34: its own token grid up to the widest decode graph, 3 requests x 3 tokens.
    ("0.34", ["FULL/1tok/1req/mql3", "FULL/2tok/2req/mql3", "FULL/4tok/4req/mql3",
              "FULL/8tok/4req/mql3", "FULL/9tok/4req/mql3"])])
def test_varlen_decode_graphs_replace_the_uniform_ones_up_to_the_decode_limit(release,
                                                                            varlen_graphs):
    varlen = [d.label() for d in GraphTable.build(drafts(max_num_reqs=4,
                                                         release=release)).descriptors]
    assert varlen == [*varlen_graphs, "PIECEWISE/8tok", "PIECEWISE/16tok"]
    uniform = [d.label() for d in GraphTable.build(
        drafts(max_num_reqs=4, varlen_decode=False, release=release)).descriptors]
    assert uniform == ["FULL/9tok/3req/uct3", "PIECEWISE/8tok", "PIECEWISE/16tok"]
    # The spec's plain statement of the table builds the same descriptors.
    for config in (drafts(max_num_reqs=4, release=release),
                   drafts(max_num_reqs=4, varlen_decode=False, release=release)):
        assert graph_table(config) == list(GraphTable.build(config).descriptors)


def test_a_prefill_on_one_rank_keeps_every_rank_out_of_the_varlen_decode_graphs():
    decodes = plan_without_world(drafts(), [batch([1, 3, 2]), batch([2, 1])])
    assert [p.desc.label() for p in decodes] == ["FULL/8tok/8req/mql3"] * 2
    mixed = plan_without_world(drafts(), [batch([1, 3, 2]), batch([5, 1])])
    assert [p.desc.label() for p in mixed] == ["PIECEWISE/8tok"] * 2


def test_the_rank_local_bound_sends_the_decode_rank_alone_to_a_varlen_graph():
    plans = plan_without_world(drafts(query_len_bound="rank-local"),
                               [batch([1, 3, 2]), batch([5, 1])])
    assert [p.desc.cg_mode for p in plans] == [CudaGraphMode.FULL, CudaGraphMode.PIECEWISE]
    assert first_disagreement(plans).field == "cg_mode"


# -- the skip_drafts row ---------------------------------------------------------------------

@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_drafts_are_skipped_only_when_every_rank_down_to_the_last_allows_it(ranks):
    config = drafts(ranks)
    everyone = [batch([1, 2], skip=True) for _ in range(ranks)]
    assert all(p.state.skip_drafts for p in plan_without_world(config, everyone))
    last_refuses = everyone[:-1] + [batch([1, 2], skip=False)]
    plans = plan_without_world(config, last_refuses)
    assert not any(p.state.skip_drafts for p in plans)
    assert plans == spec_plans(config, last_refuses)


def test_an_idle_rank_votes_on_skip_drafts_with_its_dummy_batch():
    plans = plan_without_world(drafts(), [batch([], skip=True), batch([2], skip=True)])
    assert all(p.state.skip_drafts for p in plans)


def records_of(plans) -> list[StepRecord]:
    return [StepRecord(rank=p.rank, step=0, plan=p, executed="replay", captured_split=(),
                       replay_split=(), fingerprint=(), routes=(), outputs=(), state=(),
                       threads_alive=(), pending_run=False, error=None, injected_fault=False,
                       seconds=0.0) for p in plans]


def with_skip_on_last_rank_flipped(plans):
    last = plans[-1]
    flipped = replace(last, state=replace(last.state, skip_drafts=not last.state.skip_drafts))
    return plans[:-1] + [flipped]


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_a_skip_drafts_value_only_the_last_rank_got_wrong_is_named_by_every_checker(ranks):
    config = drafts(ranks)
    batches = [batch([1, 2], skip=True) for _ in range(ranks)]
    right = plan_without_world(config, batches)
    wrong = with_skip_on_last_rank_flipped(right)
    disagreement = first_disagreement(wrong)
    assert disagreement.field == "skip_drafts" and disagreement.values[ranks - 1] is False
    differential = check_differential(records_of(wrong), right)
    assert not differential.ok and f"rank {ranks - 1}: skip_drafts" in differential.detail
    spec = check_spec_decision(records_of(wrong), spec_plans(config, batches))
    assert not spec.ok and f"rank {ranks - 1}: skip_drafts" in spec.detail
    assert check_differential(records_of(right), right).ok


def test_a_sync_that_reads_skip_drafts_from_rank_0_alone_is_caught_by_the_spec_checker():
    config = drafts(3)
    batches = [batch([1], skip=True), batch([1], skip=True), batch([1], skip=False)]
    tables = [GraphTable.build(config, r) for r in range(3)]
    rows = gathered_rows(tables, batches)
    assert rows[6] == [1, 1, 0]
    rows[6] = [rows[6][0]] * 3  # the slip: rank 0's vote stands for everyone's
    slipped = [decide_from_matrix(config, tables[r], rows, b) for r, b in enumerate(batches)]
    plans = [replace(p, state=d.state) for p, d in zip(plan_without_world(config, batches),
                                                       slipped, strict=True)]
    assert first_disagreement(plans) is None  # every rank got the same wrong answer
    verdict = check_spec_decision(records_of(plans), spec_plans(config, batches))
    assert not verdict.ok and "skip_drafts: True (spec: False)" in verdict.detail


# -- scenarios -------------------------------------------------------------------------------

def test_a_skip_drafts_vote_is_written_only_when_set_and_read_back():
    scenario = Scenario(drafts(), ((RankBatch.from_query_lens((1, 3), allow_skip_drafts=True),
                                    RankBatch.from_query_lens((2,))),))
    ranks = scenario.to_dict()["steps"][0]["ranks"]
    assert ranks == [{"query_lens": [1, 3], "allow_skip_drafts": True}, {"query_lens": [2]}]
    again = scenario_from_dict(json.loads(scenario.to_json()))
    assert again.steps == scenario.steps
    assert [b.allow_skip_drafts for b in again.batches(0)] == [True, False]
    assert again.batches(0)[0].max_query_len == 3


def test_a_skip_drafts_vote_that_is_not_a_boolean_is_refused_naming_the_field():
    with pytest.raises(ConfigError) as error:
        scenario_from_dict({"config": {"enable_dbo": False, "decode_query_len": 2},
                            "steps": [{"ranks": [{"tokens": 2, "allow_skip_drafts": 1},
                                                 {"tokens": 2}]}]})
    assert error.value.field == "steps[0].ranks[0].allow_skip_drafts"


@pytest.mark.parametrize("release, last_step", [
    ("0.33", ["FULL/16tok/8req/mql3"] * 2),
    # 0.34's varlen graphs end at 9 tokens here (3 requests x 3): 11 tokens run PIECEWISE.
    ("0.34", [None, None])])
def test_varlen_decode_graphs_replay_mixed_decode_lengths_correctly_on_the_sim_world(
        release, last_step):
    # Step 0 has a prefill (PIECEWISE for both), step 1 replays the 8-token varlen graph and
    # step 2 the 16-token one (0.33), padded to their requests; every checker holds, the
    # reference rows included.
    steps = (((1, 3, 2), (5, 1)), ((1, 3, 2), (2, 1, 3)), ((3, 1, 1, 2, 3, 1), (1, 1)))
    scenario = Scenario(drafts(release=release), tuple((RankBatch.from_query_lens(a),
                                         RankBatch.from_query_lens(b, allow_skip_drafts=True))
                                        for a, b in steps))
    with SimWorld(2, FUZZ_TIMEOUTS) as world:
        result = judge(world.run(scenario))
    assert result.ok, result.failed_verdicts()
    replayed = [[r.replayed for r in step.records] for step in result.steps]
    assert replayed == [[None, None], ["FULL/8tok/8req/mql3"] * 2, last_step]


def test_the_rank_local_bound_scenario_names_agreement_and_is_clean_in_the_reference():
    scenario = load_scenario(SCENARIOS / "rank-local-query-len-bound.json")
    with SimWorld(2, FUZZ_TIMEOUTS) as world:
        buggy = judge(world.run(scenario))
        clean = judge(world.run(scenario.with_reference_behaviour()))
    failed = {v.checker: v.detail for _, v in buggy.failed_verdicts()}
    assert failed["agreement"] == ("cg_mode differs: ranks [0] have 'FULL'; ranks [1] have "
                                   "'PIECEWISE'")
    # The spec plants no bug: rank 0's dispatch with its own bound is not what it plans.
    assert failed["spec_decision"] == "rank 0: cg_mode: FULL (spec: PIECEWISE)"
    assert clean.ok, clean.failed_verdicts()


# -- the generator ---------------------------------------------------------------------------

def test_the_fuzzer_draws_drafts_varlen_graphs_and_every_layout_without_microbatching():
    seen: set[str] = set()

    @settings(max_examples=150, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def draw(data):
        config = data.draw(fuzz_configs({"enable_dbo": False, "ubatch_size": 0},
                                        dp_sizes=(3,)))
        assert config.serving.decode_query_len == 1 or not config.use_ubatching
        q = config.serving.decode_query_len
        seen.add(f"q{q}")
        if config.serving.varlen_decode:
            seen.add("varlen")
        if q == 1:
            return
        batches = data.draw(draft_batches(config))
        for b in batches:
            if b.num_tokens and b.max_query_len is None:
                seen.add("prefill")
            elif b.uniform_token_count == q:
                seen.add("uniform")
            elif b.num_tokens and len(set(b.query_lens)) > 1:
                seen.add("varlen-batch")
        if all(b.allow_skip_drafts for b in batches):
            seen.add("all-skip")
        if not any(b.allow_skip_drafts for b in batches):
            seen.add("none-skip")

    draw()
    assert seen >= {"q1", "q2", "q3", "q4", "varlen", "prefill", "uniform", "varlen-batch",
                    "all-skip", "none-skip"}, seen


def test_the_variant_is_found_by_agreement_from_an_empty_database(tmp_path):
    variant = VARIANTS["rank-local-query-len-bound"]
    with SimWorld(2, FUZZ_TIMEOUTS) as world:
        outcome = fuzz(variant, world.run, world="sim", dp_sizes=(2,),
                       budget=Budget(examples=200, seconds=None, shrink_seconds=20.0),
                       database=None, scenario_dir=tmp_path, seed=0)
    assert outcome.found and outcome.checker in variant.caught_by, outcome.note
    assert outcome.scenario.config.mutation.query_len_bound.value == "rank-local"


def test_the_reference_holds_on_draft_configs_with_the_varlen_decode_graphs(tmp_path):
    # The fuzzer's own space with microbatching off: every checker holds on the reference.
    reference = replace(VARIANTS["reference"], fault_kinds=())
    with SimWorld(3, FUZZ_TIMEOUTS) as world:
        outcome = fuzz(reference, world.run, world="sim", dp_sizes=(3,),
                       fixed={"enable_dbo": False, "ubatch_size": 0},
                       budget=Budget(examples=60, seconds=None, shrink_seconds=10.0),
                       database=None, scenario_dir=tmp_path, seed=1)
    assert not outcome.found, f"{outcome.checker}: {outcome.detail}"
    assert outcome.examples >= 30, outcome.note  # the budget was spent searching
