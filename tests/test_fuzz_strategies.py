"""The fuzzer's generators: skew shapes, boundary pulls, pinned fields and the steering."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings, target
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from harness.batch import RankBatch
from harness.config import CudaGraphMode, HarnessConfig
from harness.fuzz.engine import scenario_strategy
from harness.fuzz.variants import VARIANTS
from harness.gen.aim import steering, steps_with_microbatch_threads
from harness.gen.strategies import (
    boundary_token_counts,
    decode_beside_mixed,
    fuzz_configs,
    skewed_token_counts,
    straddling_token_counts,
    uneven_reqs,
)
from harness.scenario import Scenario
from harness.sut.graph_table import GraphTable
from harness.sut.step_plan import plan_without_world
from harness.sut.thresholds import last_region_start

CONFIG = HarnessConfig.of(dp_size=4, capture_sizes=(16, 32), max_num_reqs=64,
                          max_num_batched_tokens=64, decode_threshold=4, prefill_threshold=16)


def test_boundaries_hold_thresholds_sizes_region_starts_their_neighbours_and_one_past_the_top():
    points = set(boundary_token_counts(CONFIG))
    assert {3, 4, 5, 15, 16, 17, 31, 32, 33} <= points  # thresholds, sizes, +-1
    assert {7, 8, 9} <= points  # the region start of 16 for k = 2
    assert 33 in points  # the largest capture size + 1: no graph holds it


@given(straddling_token_counts(CONFIG))
def test_a_straddle_puts_one_rank_on_a_region_start_and_pads_the_rest_to_one_graph(counts):
    light = min(counts)
    heavy = [n for i, n in enumerate(counts) if i != counts.index(light)]
    graph = next(g for g in (16, 32) if max(counts) <= g)
    assert all(n <= graph for n in heavy) and max(counts) > (16 if graph == 32 else 0)
    starts = {last_region_start(g, 2) for g in (16, 32)}
    assert any(abs(light - s) <= 1 for s in starts)


def test_a_straddle_at_four_microbatches_sits_by_the_last_region_start_about_half_the_time():
    # With every start equally likely it would be one draw in three, plus the 5-start's
    # neighbours; the guard decides only at the last one.
    config = HarnessConfig.of(dp_size=2, ubatch_size=4, enable_dbo=False, capture_sizes=(32,),
                              max_num_reqs=64, max_num_batched_tokens=64, decode_threshold=4,
                              prefill_threshold=16)
    near_last, draws = 0, 0

    @settings(max_examples=400, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(straddling_token_counts(config))
    def count(counts):
        nonlocal near_last, draws
        draws += 1
        near_last += abs(min(counts) - last_region_start(32, 4)) <= 1

    count()
    assert near_last >= 0.45 * draws, (near_last, draws)


@given(st.data())
def test_every_skew_shape_gives_one_legal_count_per_rank(data):
    counts = data.draw(skewed_token_counts(CONFIG))
    assert len(counts) == CONFIG.serving.dp_size
    assert all(0 <= n <= CONFIG.serving.max_num_batched_tokens for n in counts)


@pytest.mark.parametrize("shape, holds", [
    ("an idle rank", lambda c: 0 in c and max(c) > 0),
    ("all ranks equal", lambda c: len(set(c)) == 1 and c[0] > 0),
    ("one heavy rank", lambda c: sum(n > 2 for n in c) == 1),
    ("a zipf tail", lambda c: max(c) >= 12 and sorted(c, reverse=True) == [
        max(c) // d for d in (1, 2, 3, 4)]),
])
def test_each_skew_shape_is_drawn(shape, holds):
    find(skewed_token_counts(CONFIG), holds, settings=settings(max_examples=2000, database=None))


@given(fuzz_configs({"guard": "merged", "capture_sizes": [24], "dp_size": 3}))
def test_pinned_fields_are_kept_and_the_rest_is_drawn_legal(config):
    assert (config.mutation.guard.value, config.serving.capture_sizes,
            config.serving.dp_size) == ("merged", (24,), 3)
    # The pinned size is the one graph captured, except where the drawn mode captures none.
    captures = config.serving.cudagraph_mode is not CudaGraphMode.NONE
    assert config.cudagraph_capture_sizes == ((24,) if captures else ())
    assert config.serving.decode_threshold >= config.num_ubatches


@given(fuzz_configs({"enable_dbo": False, "ubatch_size": 3}))
def test_a_pinned_microbatch_count_lifts_drawn_thresholds_to_it(config):
    assert config.num_ubatches == 3
    assert min(config.serving.decode_threshold, config.serving.prefill_threshold) >= 3


@settings(max_examples=50, suppress_health_check=[HealthCheck.too_slow])
@given(scenario_strategy(VARIANTS["stock-protocol"], {}, (2, 3)))
def test_a_protocol_variant_carries_its_fault_in_every_scenario(scenario):
    assert [f.kind.value for f in scenario.faults] == ["raise_in_ubatch"]
    assert scenario.config.mutation.protocol.value == "stock"


def test_steering_is_highest_at_the_guard_boundary_and_counts_padding():
    config = HarnessConfig.of(dp_size=2, capture_sizes=(16,), max_num_reqs=64,
                              max_num_batched_tokens=64, decode_threshold=2, prefill_threshold=16)

    def scenario(a: int, b: int) -> Scenario:
        return Scenario(config, ((RankBatch.from_query_lens((1,) * a),
                                  RankBatch.from_query_lens((1,) * b)),))

    at_boundary, away = steering(scenario(8, 16)), steering(scenario(12, 16))
    assert at_boundary["guard boundary closeness"] > away["guard boundary closeness"]
    assert steering(scenario(9, 10))["padding"] == 7.0  # 9 tokens padded to the 16 graph


def test_most_microbatch_faults_land_on_a_step_whose_microbatch_threads_run():
    # Only there can such a fault fire; on DP 4 those steps are a minority of the drawn ones.
    strategy = scenario_strategy(VARIANTS["stock-protocol"], {}, (4,))
    aimed, with_threads = 0, 0

    # Enough examples that three aimed draws in four stand well clear of the bound.
    @settings(max_examples=600, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def count(scenario):
        nonlocal aimed, with_threads
        batches = [scenario.batches(i) for i in range(len(scenario.steps))]
        threaded = steps_with_microbatch_threads(scenario.config, batches)
        if threaded and len(threaded) < len(batches):
            with_threads += 1
            aimed += scenario.faults[0].step in threaded

    count()
    assert with_threads >= 10
    assert aimed >= 0.65 * with_threads


@given(decode_beside_mixed(CONFIG))
def test_decode_beside_mixed_puts_uniform_decodes_next_to_mixed_batches_within_one_graph(
        batches):
    # Where the synced uniform-decode count and the all-ranks uniform-decode test decide.
    kinds = [b.uniform_token_count == 1 for b in batches]
    assert any(kinds) and not all(kinds)
    assert all(CONFIG.serving.decode_threshold <= b.num_tokens <= 32 for b in batches)
    assert all(b.num_reqs < b.num_tokens for b, decode in zip(batches, kinds, strict=True)
               if not decode)


def test_one_step_in_eight_or_more_puts_decodes_beside_mixed_batches_within_one_graph():
    # Without the shape, 6% of DP-3 steps are such; with it, 18%.
    counted, steps = 0, 0

    @settings(max_examples=800, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(scenario_strategy(VARIANTS["reference"], {}, (3,)))
    def count(scenario):
        nonlocal counted, steps
        if scenario.config.serving.decode_query_len > 1:
            return  # draft-token steps have layouts of their own (docs/spec.md §1.6)
        for i in range(len(scenario.steps)):
            steps += 1
            counted += _decodes_beside_mixed_within_one_graph(scenario.config,
                                                              scenario.batches(i))

    count()
    assert counted >= steps / 8, (counted, steps)


def _decodes_beside_mixed_within_one_graph(config, batches) -> bool:
    decode = [b.uniform_token_count == 1 for b in batches]
    tokens = [b.num_tokens for b in batches]
    return (any(decode) and not all(decode) and bool(config.cudagraph_capture_sizes)
            and min(tokens) >= config.serving.decode_threshold
            and max(tokens) <= config.max_capture_size)


def test_the_first_reference_scenario_tried_carries_no_fault_yet_some_drawn_ones_do():
    # Hypothesis tries the simplest example first and shrinks toward it; a faulted example
    # costs its timeouts, so the rare fault must not be the default.
    strategy = scenario_strategy(VARIANTS["reference"], {}, (2,))
    first: list[Scenario] = []

    @settings(max_examples=1, phases=[Phase.generate], database=None)
    @given(strategy)
    def try_one(scenario):
        first.append(scenario)

    try_one()
    assert first[0].faults == ()
    find(strategy, lambda s: bool(s.faults), settings=settings(max_examples=500, database=None))


def test_the_uneven_request_limit_lies_between_half_and_all_of_the_size_and_divides_nothing():
    assert [uneven_reqs(n) for n in (1, 2, 3, 4, 8, 12, 32, 48)] == [1, 1, 2, 3, 5, 7, 17, 25]
    assert all(n % uneven_reqs(n) for n in range(3, 200))


def test_one_config_in_twelve_or_more_has_a_capture_size_its_request_limit_does_not_divide():
    # Issue 14 part 4: max_num_reqs below a capture size, so that size's token count does not
    # divide by its request count. Without the uneven draw, 6 configs in 400 were such.
    uneven, configs = 0, 0

    @settings(max_examples=300, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(scenario_strategy(VARIANTS["reference"], {}, (2, 3, 4)))
    def count(scenario):
        nonlocal uneven, configs
        cfg = scenario.config
        configs += 1
        uneven += any(g > cfg.serving.max_num_reqs and g % cfg.serving.max_num_reqs
                      for g in cfg.cudagraph_capture_sizes)

    count()
    assert uneven >= configs / 12


class _Reached(Exception):
    pass


@pytest.mark.parametrize("dp", [2, 3, 4])
def test_every_seeded_search_for_unreachable_twins_draws_a_config_that_has_them(dp):
    # Issue 17: the DP 4 search on seed 0 drew no such config in 400 examples (they need FULL
    # mode and a request limit below the largest capture size), nor did 3 of 30 other
    # seeded searches in 300. The fuzzer's own strategy, profile and targets, no world.
    variant, misses = VARIANTS["unreachable-twins"], []
    for seed in range(4):
        @settings(settings.get_profile("dev"), max_examples=300, database=None, deadline=None,
                  phases=[Phase.generate, Phase.target], suppress_health_check=list(HealthCheck))
        @given(scenario_strategy(variant, {}, (dp,)))
        def search(scenario):
            for label, value in steering(scenario).items():
                target(value, label=label)
            if GraphTable.build(scenario.config).unreachable_twins():
                raise _Reached

        try:
            hypothesis_seed(seed)(search)()
            misses.append(seed)
        except _Reached:
            pass
    assert not misses, f"DP {dp}: seeds {misses} drew no config with an unreachable twin"


def test_an_idle_rank_beside_peers_that_pad_it_past_the_smallest_graph_is_drawn_often():
    # Where an idle rank's dummy batch must pad to the agreed graph (vLLM issue #26137): the
    # variant draws graph modes and two sizes. Seeds 0-2: 90 steps in 1842 (41 before FULL
    # mode drew request limits below the largest size); one fixed sample swung 25 -> 15.
    # Since the search also draws releases, drafts beside microbatching and draft schedules,
    # 34 in 1923 (2026-12-06); the variant is still found in 4 and 20 examples (seeds 0, 1).
    hits, steps = 0, 0

    @settings(max_examples=300, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(scenario_strategy(VARIANTS["idle-rank-dummy-unpadded"], {}, (2, 3, 4)))
    def count(scenario):
        nonlocal hits, steps
        cfg = scenario.config
        for i in range(len(scenario.steps)):
            steps += 1
            plans = plan_without_world(cfg, scenario.batches(i))
            hits += any(p.real_tokens == 0 and p.desc.cg_mode is not CudaGraphMode.NONE
                        and p.num_tokens > min(cfg.cudagraph_capture_sizes) for p in plans)

    for seed in range(3):
        hypothesis_seed(seed)(count)()
    assert hits >= steps / 80, (hits, steps)
