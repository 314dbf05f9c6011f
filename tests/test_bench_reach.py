"""The reach table: each field's classifier on hand-built scenarios it must take and refuse,
the table's rows from given examples (no clock), the never case, and its command line."""

from __future__ import annotations

import pytest

from harness.bench.reach import Arrival, ReachRow, drawn_examples, print_reach, reach_rows
from harness.gen.aim import reference_plans
from harness.gen.reach import (
    FIELDS,
    Field,
    at_draft_bound,
    at_guard_edge,
    at_request_limit,
    crosses_region,
    cut_between_requests,
    drafts_split,
    exercised_fields,
    has_draft_schedule,
    has_drafts,
    has_fault,
    has_idle_rank,
    models_0_33,
    replays_twin,
    straddles_region,
    trims_drafts_in_split,
)
from harness.scenario import Scenario, scenario_from_dict

SPLIT = {"capture_sizes": [16], "max_num_reqs": 16, "max_num_batched_tokens": 64,
         "decode_threshold": 4, "prefill_threshold": 4}  # k = 2: the guard's edge at 8 of 16
EAGER_SPLIT = {**SPLIT, "cudagraph_mode": "NONE"}
DRAFTS = {"enable_dbo": False, "decode_query_len": 2, "varlen_decode": True,
          "cudagraph_mode": "FULL_AND_PIECEWISE", "capture_sizes": [8, 16]}
DECODES_BESIDE_PREFILL = [{"query_lens": [2, 2, 1]}, {"query_lens": [5, 1]}]


def scenario(config: dict, *steps: list, faults: tuple = ()) -> Scenario:
    data = {"config": config, "steps": [{"ranks": ranks} for ranks in steps]}
    if faults:
        data["faults"] = list(faults)
    return scenario_from_dict(data)


def decodes(*counts: int) -> list[dict]:
    return [{"tokens": n} for n in counts]


@pytest.mark.parametrize("smallest", [7, 8, 9])
def test_a_split_step_whose_smallest_rank_is_within_one_of_the_last_region_start_is_at_the_edge(
        smallest):
    assert at_guard_edge(scenario(SPLIT, decodes(16, smallest)))


@pytest.mark.parametrize("config, counts", [
    (SPLIT, (16, 10)),  # two past the edge
    (SPLIT, (16, 6)),  # two below it
    (EAGER_SPLIT, (16, 8)),  # on the edge, but no twin for the guard to weigh
    ({**SPLIT, "decode_threshold": 12}, (16, 8)),  # on the edge, but the step does not split
])
def test_a_step_away_from_the_edge_or_without_a_twin_or_unsplit_is_not_at_the_guard_edge(
        config, counts):
    assert not at_guard_edge(scenario(config, decodes(*counts)))


def test_the_guard_edge_is_looked_for_in_every_step_not_only_the_first():
    assert at_guard_edge(scenario(SPLIT, decodes(16, 12), decodes(16, 8)))


def test_a_step_replaying_a_microbatched_graph_exercises_twins_and_an_eager_split_does_not():
    assert replays_twin(scenario(SPLIT, decodes(16, 12)))
    assert not replays_twin(scenario(SPLIT, decodes(16, 8)))  # the guard sends it to eager
    assert not replays_twin(scenario(EAGER_SPLIT, decodes(16, 12)))


def test_drafts_are_a_decode_query_len_above_one():
    assert has_drafts(scenario(DRAFTS, DECODES_BESIDE_PREFILL))
    assert not has_drafts(scenario({**DRAFTS, "decode_query_len": 1, "varlen_decode": False},
                                   decodes(3, 4)))


def test_a_decode_rank_beside_a_prefill_on_varlen_graphs_is_at_the_draft_bound():
    assert at_draft_bound(scenario(DRAFTS, DECODES_BESIDE_PREFILL))


def test_an_idle_rank_beside_a_prefill_is_at_the_draft_bound_its_dummy_is_a_decode():
    # The idle rank syncs its dummy decode's bound (2) against the prefill's none.
    assert at_draft_bound(scenario(DRAFTS, [{"tokens": 0}, {"query_lens": [5, 1]}]))


@pytest.mark.parametrize("config, ranks", [
    (DRAFTS, [{"query_lens": [2, 2, 1]}, {"query_lens": [2, 1]}]),  # no prefill beside it
    (DRAFTS, [{"query_lens": [5, 1]}, {"query_lens": [4, 2]}]),  # no decode rank
    ({**DRAFTS, "varlen_decode": False}, DECODES_BESIDE_PREFILL),  # no bounded graph
    ({**DRAFTS, "cudagraph_mode": "FULL_DECODE_ONLY"}, DECODES_BESIDE_PREFILL),  # all eager
    # Padded to PIECEWISE 16, but the only varlen graph (2 requests of 2) holds 4 tokens.
    ({**DRAFTS, "capture_sizes": [4, 16], "max_num_reqs": 2},
     [{"query_lens": [2, 2]}, {"query_lens": [5, 1]}]),
])
def test_without_both_kinds_of_rank_or_a_varlen_graph_or_a_padded_step_the_bound_decides_nothing(
        config, ranks):
    assert not at_draft_bound(scenario(config, ranks))


def test_a_rank_with_no_tokens_is_an_idle_rank():
    assert has_idle_rank(scenario(SPLIT, decodes(5, 5), decodes(0, 8)))
    assert not has_idle_rank(scenario(SPLIT, decodes(1, 8)))


def test_a_batch_at_the_request_or_token_limit_is_at_the_request_limits():
    assert at_request_limit(scenario(SPLIT, decodes(16, 3)))  # max_num_reqs 16
    assert at_request_limit(scenario(SPLIT, [{"query_lens": [60, 4]}, {"tokens": 3}]))  # 64
    assert not at_request_limit(scenario(SPLIT, decodes(15, 3)))


def test_a_request_crossing_a_region_boundary_of_a_split_step_straddles():
    crossing = [{"query_lens": [3, 7]}, {"query_lens": [6, 4]}]  # regions of 5 and 5
    assert straddles_region(scenario(EAGER_SPLIT, crossing))
    assert not straddles_region(scenario(EAGER_SPLIT, [{"query_lens": [5, 5]}] * 2))
    # The same requests in a step that does not split cross nothing.
    assert not straddles_region(scenario({**EAGER_SPLIT, "prefill_threshold": 32}, crossing))


def test_a_request_ending_on_a_boundary_does_not_cross_it_and_one_past_it_does():
    case = scenario(EAGER_SPLIT, [{"query_lens": [5, 5]}, {"query_lens": [4, 6]}])
    plans = reference_plans(case.config, case.batches(0))
    assert [crosses_region(b, p) for b, p in zip(case.batches(0), plans, strict=True)] == [
        False, True]


def test_a_scenario_with_a_fault_exercises_faults():
    fault = {"kind": "raise_in_ubatch", "rank": 0, "step": 0, "ubatch": 0}
    assert has_fault(scenario(SPLIT, decodes(16, 12), faults=(fault,)))
    assert not has_fault(scenario(SPLIT, decodes(16, 12)))


SPLIT_DRAFTS = {**SPLIT, "decode_query_len": 3, "capture_sizes": [6, 15]}
VERIFYING_SPLIT = {"decode_query_len": 4, "varlen_decode": True, "max_num_reqs": 8,
                   "cudagraph_mode": "FULL_AND_PIECEWISE", "capture_sizes": [8, 16],
                   "decode_threshold": 2, "prefill_threshold": 4}


def test_drafts_in_a_split_step_cut_between_requests_are_the_new_surfaces_of_0_34():
    uniform = scenario(SPLIT_DRAFTS, [{"query_lens": [3] * 5}, {"query_lens": [3] * 5}])
    assert drafts_split(uniform) and cut_between_requests(uniform)
    one_token = scenario(SPLIT, decodes(12, 12))
    assert not drafts_split(one_token) and not cut_between_requests(one_token)
    unsplit = scenario({**SPLIT_DRAFTS, "enable_dbo": False},
                       [{"query_lens": [3] * 5}, {"query_lens": [3] * 5}])
    assert not drafts_split(unsplit) and not cut_between_requests(unsplit)


def test_a_release_schedule_and_trimmed_drafts_each_have_their_field():
    assert models_0_33(scenario({**SPLIT, "release": "0.33"}, decodes(4, 4)))
    assert not models_0_33(scenario(SPLIT, decodes(4, 4)))
    scheduled = {**SPLIT_DRAFTS, "max_num_reqs": 16, "draft_schedule": [[3, 2], [2, 16]]}
    assert has_draft_schedule(scenario(scheduled, decodes(4, 4)))
    assert not has_draft_schedule(scenario(SPLIT_DRAFTS, decodes(4, 4)))
    trimmed = [{"query_lens": [1, 1, 2], "scheduled_lens": [4, 4, 4]}, {"query_lens": [2, 2]}]
    assert trims_drafts_in_split(scenario(VERIFYING_SPLIT, trimmed))
    assert not trims_drafts_in_split(scenario({**VERIFYING_SPLIT, "enable_dbo": False}, trimmed))
    assert not trims_drafts_in_split(scenario(VERIFYING_SPLIT, [{"query_lens": [1, 1, 2]},
                                                               {"query_lens": [2, 2]}]))


def test_every_field_is_named_once_with_a_one_line_meaning():
    names = [f.name for f in FIELDS]
    assert len(set(names)) == len(names) >= 7
    assert all(f.meaning and "\n" not in f.meaning for f in FIELDS)
    assert exercised_fields(scenario(SPLIT, decodes(16, 12))) == {"twins", "request limits"}


def test_reference_examples_are_drawn_without_a_world_each_one_distinct():
    drawn = drawn_examples(12, seed=3)
    assert len(drawn) == 12 and len({s.to_json() for s in drawn}) == 12
    assert all(s.name == "fuzz-reference" for s in drawn)


ALWAYS = Field("always", "every example", lambda s: True)
SECOND = Field("second", "the second example", lambda s: s.name == "b")
NEVER = Field("never", "no example", lambda s: False)


def test_the_rows_count_shares_of_the_draws_and_the_first_fuzz_example_of_each_field():
    a, b = (scenario_from_dict({"name": n, "steps": [[1, 1]]}) for n in "ab")
    arrivals = [Arrival(2.0, a), Arrival(3.0, b), Arrival(6.0, b)]
    rows = reach_rows([[a, b], [b, b]], arrivals, (ALWAYS, SECOND, NEVER))
    always, second, never = rows
    assert (always.share, always.first_s, always.first_example) == (1.0, 2.0, 1)
    assert (second.share, second.run_hits, second.first_s, second.first_example) == (
        0.75, 2, 3.0, 2)
    assert second.expected_s() == pytest.approx(2.0 / 0.75)  # 6 s over 3 examples
    assert (second.seeds, second.seeds_reaching) == (2, 2) and second.meets_goal()
    assert (never.share, never.first_s, never.first_example, never.expected_s()) == (
        0.0, None, None, None)
    assert not never.meets_goal() and always.meets_goal()


def test_a_field_one_seed_of_the_draws_never_reached_misses_the_goal_despite_its_share():
    a, b = (scenario_from_dict({"name": n, "steps": [[1, 1]]}) for n in "ab")
    row = reach_rows([[b, b, b], [a, a, a]], [Arrival(1.0, a)], (SECOND,))[0]
    assert (row.share, row.expected_s(), row.seeds_reaching) == (0.5, 2.0, 1)
    assert not row.meets_goal()


def test_the_table_prints_never_for_a_field_no_example_reached_and_flags_it(capsys):
    rows = [ReachRow("twins", "a twin", 100, 5, 3, 4.5, 12, 0.5, 4, 4),
            ReachRow("drafts", "drafts", 100, 0, 0, None, None, 0.5, 4, 0),
            ReachRow("slow", "rare", 100, 1, 1, 40.0, 80, 0.5, 4, 1)]
    print_reach(rows, 90)
    lines = capsys.readouterr().out.splitlines()
    twins = next(line for line in lines if line.startswith("twins"))
    assert twins.split()[:8] == ["twins", "5.0%", "4/4", "3/90", "4.5", "12", "10.0", "yes"]
    drafts = next(line for line in lines if line.startswith("drafts")).split()
    assert drafts[2] == "0/4" and drafts[4:8] == ["never", "never", "never", "NO"]
    assert next(line for line in lines if line.startswith("slow")).split()[6:8] == ["50.0", "NO"]


def test_no_draws_and_no_fuzz_examples_give_never_rows_not_a_crash(capsys):
    rows = reach_rows([], [])
    print_reach(rows, 0)
    assert all(r.expected_s() is None and r.first_s is None for r in rows)
    assert capsys.readouterr().out.count("never") == 3 * len(FIELDS)


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_bad_reach_seconds_is_one_line_naming_the_flag_and_exit_2(capsys, value):
    from harness.bench.throughput import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--reach-seconds", value, "--reach-only"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("python -m harness.bench: error: --reach-seconds:")
    assert value in err[-1]


def test_reach_only_with_no_seconds_is_refused_in_one_line(capsys):
    from harness.bench.throughput import main

    with pytest.raises(SystemExit):
        main(["--reach-only", "--reach-seconds", "0"])
    assert "--reach-seconds: 0 skips" in capsys.readouterr().err.strip().splitlines()[-1]


def test_the_default_bench_prints_the_reach_table_after_the_throughput_rows(monkeypatch,
                                                                             capsys):
    import harness.bench.throughput as bench

    monkeypatch.setattr(bench, "decode_examples", lambda n: [])
    monkeypatch.setattr(bench, "print_throughput", lambda *a: print("throughput"))
    monkeypatch.setattr(bench, "print_reach_table", lambda s: print(f"reach {s}"))
    assert bench.main(["--detection-seeds", "0", "--dp4-examples", "0",
                       "--rebuild-rounds", "0", "--staging-draws", "0", "--exec-examples", "0",
                       "--schedule-examples", "0", "--reach-seconds", "12"]) == 0
    assert capsys.readouterr().out.split("\n")[:2] == ["throughput", "reach 12.0"]
