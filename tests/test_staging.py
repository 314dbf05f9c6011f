"""Real-token staging (docs/spec.md §3.4): the decision and layout as pure functions, the
spec's second statement of them, and staged replays on the sim world held to every checker."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.batch import RankBatch
from harness.bug_switches import Guard, StagingRestore
from harness.check.agreement import first_disagreement
from harness.check.judge import judge
from harness.config import CudaGraphMode, HarnessConfig
from harness.gen.strategies import GRAPH_MODES, configs, laid_out, steps, straddling_token_counts
from harness.history.decision import GraphDescriptor
from harness.scenario import scenario_from_dict
from harness.spec.decision import spec_plans
from harness.sut.staged_replay import StagedLayout, restored_rows
from harness.sut.staging import can_stage, scheduled_routes, staged_rows
from harness.sut.step_plan import plan_without_world
from harness.timeouts import Timeouts
from harness.world.sim.world import SimWorld

FAST = Timeouts(collective_s=2.0, hang_s=4.0, step_deadline_s=15.0)
SMALL = {"capture_sizes": [16, 32], "max_num_reqs": 32, "max_num_batched_tokens": 64,
         "decode_threshold": 4, "prefill_threshold": 16}
STAGED = {**SMALL, "staging": True}


def staging_on(config: HarnessConfig) -> HarnessConfig:
    return config.with_changes(staging=True)


def decode(*tokens: int) -> list[RankBatch]:
    return [RankBatch.uniform(n) for n in tokens]


def plans(fields: dict, *tokens: int):
    return plan_without_world(HarnessConfig.of(**fields), decode(*tokens))


def test_the_staged_guard_keeps_the_twin_the_fixed_guard_sends_to_eager():
    assert {p.kind for p in plans(SMALL, 5, 16)} == {"eager-microbatched"}
    staged = plans(STAGED, 5, 16)
    assert {p.kind for p in staged} == {"full-microbatched"}
    assert {p.desc.label() for p in staged} == {"FULL/16tok/16req/uct1/ub2"}
    assert [[r.real_tokens for r in p.regions] for p in staged] == [[3, 2], [8, 8]]
    assert {p.state.staged_tokens for p in staged} == {(5, 16)}


def test_a_step_the_fixed_guard_replays_is_not_staged():
    for tokens in [(9, 16), (16, 16), (20, 24)]:
        fixed, staged = plans(SMALL, *tokens), plans(STAGED, *tokens)
        assert staged == fixed, tokens
        assert all(p.state.staged_tokens is None for p in staged)


def test_real_tokens_are_dealt_to_the_region_starts_in_scheduled_order():
    assert staged_rows(5, 16, 2) == (0, 1, 2, 8, 9)
    assert staged_rows(2, 16, 2) == (0, 8)
    # k = 3, G = 12: regions [0,4) [4,8) [8,12); 4 tokens: two in the first region.
    assert staged_rows(4, 12, 3) == (0, 1, 4, 8)
    assert staged_rows(8, 12, 3) == (0, 1, 2, 4, 5, 6, 8, 9)


def test_a_rank_whose_tokens_reach_the_last_region_keeps_them_in_place():
    assert staged_rows(12, 16, 2) == tuple(range(12))
    assert staged_rows(9, 12, 3) == tuple(range(9))


def test_every_region_of_a_staging_rank_holds_a_real_token_and_no_more_than_it_fits():
    for k in (2, 3, 4):
        for graph in range(k, 49):
            size = graph // k
            for n in range(k, graph + 1):
                rows = staged_rows(n, graph, k)
                assert len(set(rows)) == n and list(rows) == sorted(rows)
                assert all(0 <= row < graph for row in rows)
                starts = [i * size for i in range(k)] + [graph]
                assert all(any(starts[i] <= row < starts[i + 1] for row in rows)
                           for i in range(k)), (n, graph, k)


def test_staging_needs_one_token_requests_and_a_token_per_region():
    twin = GraphDescriptor(CudaGraphMode.FULL, 16, 16, 1, num_ubatches=2)
    assert can_stage(2, twin) and not can_stage(1, twin)
    longer = GraphDescriptor(CudaGraphMode.FULL, 8, 4, 2, num_ubatches=2)
    assert not can_stage(4, longer)


def test_the_slip_restores_rows_the_staging_never_wrote():
    layout = StagedLayout(staged_rows(5, 16, 2), 16, 2)
    assert restored_rows(layout, StagingRestore.INVERSE) == (0, 1, 2, 8, 9)
    assert restored_rows(layout, StagingRestore.REMAINDER_LAST) == (0, 1, 8, 9, 10)
    # With as many tokens per region the two agree: the slip needs n % k != 0.
    even = StagedLayout(staged_rows(6, 16, 2), 16, 2)
    assert restored_rows(even, StagingRestore.REMAINDER_LAST) == even.rows


def test_received_routes_are_turned_back_into_each_sources_scheduled_order():
    plan = plans(STAGED, 5, 16)[1]
    # Source 0 staged 5 tokens to rows 0-2 and 8-9; source 1 kept its 16 in place.
    routes = [(0, 8, 3), (0, 2, 1), (1, 8, 0), (0, 9, 2)]
    assert scheduled_routes(routes, plan) == ((0, 2, 1), (0, 3, 3), (0, 4, 2), (1, 8, 0))


def test_a_rank_local_vote_stages_on_one_rank_and_falls_back_on_its_peer():
    split = plans({**STAGED, "staging_vote": "rank-local"}, 5, 12)
    assert [p.kind for p in split] == ["full-microbatched", "eager-microbatched"]
    assert first_disagreement(split) is not None
    # Where every rank's own last region is empty, the slip stages everywhere, as it should.
    both = plans({**STAGED, "staging_vote": "rank-local"}, 5, 7)
    assert first_disagreement(both) is None and {p.kind for p in both} == {"full-microbatched"}


@st.composite
def straddling_decodes(draw):
    """Decodes with one light rank on a region start of a graph the others pad to: where the
    fixed guard decides between twin and eager, so where staging acts (about a third)."""
    config = draw(configs(modes=GRAPH_MODES[:3]).map(staging_on))
    limit = min(config.serving.max_num_reqs, config.serving.max_num_batched_tokens)
    counts = [min(n, limit) for n in draw(straddling_token_counts(config))]
    return config, [laid_out(config, n, n) for n in counts]


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(straddling_decodes(), steps(configs().map(staging_on))))
def test_staged_plans_agree_fill_every_region_and_match_the_spec(step):
    config, batches = step
    got = plan_without_world(config, batches)
    assert first_disagreement(got) is None
    assert all(not p.empty_regions() for p in got)
    assert got == spec_plans(config, batches)
    fixed = plan_without_world(config.with_changes(staging=False), batches)
    for staged, plain in zip(got, fixed, strict=True):
        if staged.state is not None and staged.state.staged_tokens is not None:
            assert (plain.kind, staged.kind) == ("eager-microbatched", "full-microbatched")
        else:
            assert staged == plain


def run(config: dict, steps_: list):
    scenario = scenario_from_dict({"config": config, "steps": [{"ranks": r} for r in steps_]})
    with SimWorld(config.get("dp_size", 2), FAST) as world:
        return judge(world.run(scenario))


@pytest.mark.parametrize("ranks", [2, 3])
def test_staged_steps_replay_their_twin_and_hold_every_checker(ranks):
    steps_ = [[5, 16, 16], [13, 30, 17], [4, 7, 5], [20, 24, 32], [6, 16, 9]]
    result = run({**STAGED, "dp_size": ranks}, [s[:ranks] for s in steps_])
    assert result.ok, result.failed_verdicts()
    for step in result.steps:
        assert {r.executed for r in step.records} == {"replay"}
        assert {r.plan.kind for r in step.records} == {"full-microbatched"}
    staged = [bool(step.records[0].plan.state.staged_tokens) for step in result.steps]
    assert staged == [True, True, True, False, True]


def test_a_three_way_staged_step_holds_every_checker():
    config = {**STAGED, "ubatch_size": 3, "enable_dbo": False, "capture_sizes": [12, 24],
              "decode_threshold": 3, "prefill_threshold": 3}
    result = run(config, [[4, 24], [10, 20], [7, 12], [17, 24]])
    assert result.ok, result.failed_verdicts()
    assert [{r.executed for r in s.records} for s in result.steps] == [{"replay"}] * 4
    assert [bool(s.records[0].plan.state.staged_tokens) for s in result.steps] == [
        True, True, True, False]


def test_the_bench_counts_split_steps_and_those_staging_keeps_on_their_graph():
    from harness.bench.staging import drawn_steps, staging_row

    config = HarnessConfig.of(**SMALL)
    steps_ = [(config, tuple(decode(5, 16))), (config, tuple(decode(20, 24))),
              (config, tuple(decode(2, 2)))]  # the last is below the decode threshold
    row = staging_row("handmade", steps_)
    assert (row.steps, row.split, row.full_fixed, row.full_staged, row.rescued) == (
        3, 2, 1, 2, 1)
    drawn = drawn_steps("straddle", 20, seed=0)
    assert len(drawn) == len(set(drawn)) == 20


def test_the_matrix_gets_a_staging_row_of_the_harnesss_own_decisions(tmp_path):
    from harness.fuzz.engine import FUZZ_TIMEOUTS, Budget
    from harness.fuzz.matrix import (
        STAGED_ROW,
        MatrixColumn,
        cell_fields,
        row_runs,
        rows_for,
        run_matrix,
    )
    from harness.report.matrix import matrix_markdown
    from harness.world.pool import WorldPool

    rows = rows_for([], staged=True)
    assert [r.name for r in rows] == ["none", STAGED_ROW]
    column = MatrixColumn(3, 2)
    fields = cell_fields(rows[1], column, {"sut": "vllm", "max_num_reqs": 64})
    config = HarnessConfig.of(**fields)
    assert (config.system.sut.value, config.serving.staging, config.mutation.guard,
            config.num_ubatches) == ("harness", True, Guard.FIXED, 3)
    assert not row_runs(rows[1], MatrixColumn(2, 2, "vllm-exec-hang"))
    with WorldPool("sim", "gloo", FUZZ_TIMEOUTS) as pool:
        cells = run_matrix(rows[1:], [column], pool.run, world="sim", fixed={},
                           budget=Budget(examples=8, seconds=None), seed=0,
                           found_dir=tmp_path)
        assert pool.close() == []
    assert [(c.row, c.found) for c in cells] == [(STAGED_ROW, False)]
    assert f"| {STAGED_ROW} | clean" in matrix_markdown(cells, "vllm under test: -", "8 ex")


def test_the_bench_prints_the_staging_table_alone_when_asked(monkeypatch, capsys):
    import harness.bench.throughput as bench

    asked = []
    monkeypatch.setattr(bench, "print_staging_table", lambda draws: asked.append(draws))
    monkeypatch.setattr(bench, "print_throughput", lambda *a: pytest.fail("throughput ran"))
    assert bench.main(["--staging-only", "--staging-draws", "7"]) == 0
    assert asked == [7]


@pytest.mark.parametrize("flags", [["--staging-draws", "-1"],
                                   ["--staging-only", "--staging-draws", "0"]])
def test_a_bad_staging_draw_count_is_one_line_naming_the_flag_and_exit_2(capsys, flags):
    from harness.bench.throughput import main

    with pytest.raises(SystemExit) as exit_info:
        main(flags)
    assert exit_info.value.code == 2
    assert "--staging-draws" in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("system", [{"execution": "vllm"}, {"sut": "vllm"}])
def test_staging_under_vllms_code_is_refused_naming_the_staging_field(system):
    from harness.errors import ConfigError

    for spelling in ({"staging": True}, {"guard": "staged"}):
        with pytest.raises(ConfigError) as error:
            HarnessConfig.of(**spelling, **system)
        assert error.value.field == "staging" and "own decisions and execution" in str(error.value)


def test_the_old_spelling_guard_staged_reads_as_the_staging_policy_under_the_fixed_guard():
    from harness.errors import ConfigError

    old = HarnessConfig.from_dict({**SMALL, "guard": "staged"})
    assert old == HarnessConfig.of(**STAGED) and old.mutation.planted() == ()
    assert old.to_dict()["staging"] is True and old.to_dict()["guard"] == "fixed"
    assert plans({**SMALL, "guard": "staged"}, 5, 16) == plans(STAGED, 5, 16)
    with pytest.raises(ConfigError) as error:
        HarnessConfig.of(guard="staged", staging=False)
    assert error.value.field == "guard"
    with pytest.raises(ConfigError) as error:
        HarnessConfig.of(staging="yes")
    assert error.value.field == "staging"
