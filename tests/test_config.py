"""The harness config against docs/spec.md §0 and the harness's own validation rules."""

from __future__ import annotations

import json

import pytest

from harness.config import (
    CudaGraphMode,
    Guard,
    HarnessConfig,
    Twins,
    default_capture_sizes,
    load_config_file,
    ubatching_fields,
)
from harness.errors import ConfigError

NONE = CudaGraphMode.NONE
PIECEWISE = CudaGraphMode.PIECEWISE
FULL = CudaGraphMode.FULL
FULL_DECODE_ONLY = CudaGraphMode.FULL_DECODE_ONLY
FULL_AND_PIECEWISE = CudaGraphMode.FULL_AND_PIECEWISE


def rejected_field(**kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        HarnessConfig.of(**kwargs)
    return info.value.field


# -- use_ubatching / num_ubatches (1.1, 1.2) ---------------------------------------------


def test_enable_dbo_turns_microbatching_on_with_two_microbatches():
    config = HarnessConfig.of(enable_dbo=True, ubatch_size=0)
    assert config.use_ubatching is True
    assert config.num_ubatches == 2


def test_enable_dbo_forces_two_microbatches_whatever_the_ubatch_size():
    config = HarnessConfig.of(enable_dbo=True, ubatch_size=3)
    assert config.use_ubatching is True
    assert config.num_ubatches == 2


def test_ubatch_size_three_without_enable_dbo_gives_three_microbatches():
    config = HarnessConfig.of(enable_dbo=False, ubatch_size=3)
    assert config.use_ubatching is True
    assert config.num_ubatches == 3


@pytest.mark.parametrize("ubatch_size", [0, 1])
def test_ubatch_size_below_two_without_enable_dbo_leaves_microbatching_off(ubatch_size):
    config = HarnessConfig.of(enable_dbo=False, ubatch_size=ubatch_size)
    assert config.use_ubatching is False
    assert config.num_ubatches == 1


# -- CudaGraphMode (1.3) -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "separate", "decode", "mixed"),
    [
        (NONE, False, NONE, NONE),
        (PIECEWISE, False, PIECEWISE, PIECEWISE),
        (FULL, False, FULL, FULL),
        (FULL_DECODE_ONLY, True, FULL, NONE),
        (FULL_AND_PIECEWISE, True, FULL, PIECEWISE),
    ],
)
def test_a_composite_graph_mode_splits_into_a_decode_mode_and_a_mixed_mode(
        mode, separate, decode, mixed):
    assert mode.separate_routine() is separate
    assert mode.decode_mode() is decode
    assert mode.mixed_mode() is mixed


def test_only_none_piecewise_and_full_run_a_single_routine():
    single = {m for m in CudaGraphMode if not m.separate_routine()}
    assert single == {NONE, PIECEWISE, FULL}


def test_a_graph_mode_is_parsed_from_its_name_in_any_case():
    assert CudaGraphMode.parse("full_and_piecewise") is FULL_AND_PIECEWISE
    assert CudaGraphMode.parse("Full_Decode_Only") is FULL_DECODE_ONLY
    assert HarnessConfig.of(cudagraph_mode="none").serving.cudagraph_mode is NONE


# -- capture sizes (1.4) -------------------------------------------------------------------


def test_four_requests_give_the_ladder_up_to_eight():
    # largest = min(2 * 4, 512, 256) = 8: [1, 2, 4] plus range(8, 9, 8).
    assert default_capture_sizes(4, 256) == (1, 2, 4, 8)
    assert HarnessConfig.of(max_num_reqs=4).cudagraph_capture_sizes == (1, 2, 4, 8)


def test_one_request_gives_only_sizes_one_and_two():
    assert default_capture_sizes(1, 256) == (1, 2)


def test_sixty_four_requests_give_steps_of_eight_up_to_twice_the_requests():
    # largest = min(128, 512, 256) = 128; 256 tokens is above it and is not added.
    expected = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128)
    assert default_capture_sizes(64, 256) == expected
    config = HarnessConfig.of(max_num_reqs=64, max_num_batched_tokens=256)
    assert config.cudagraph_capture_sizes == expected
    assert config.max_capture_size == 128


def test_a_large_budget_switches_to_steps_of_sixteen_from_256_and_caps_at_512():
    sizes = default_capture_sizes(256, 8192)
    assert sizes[:5] == (1, 2, 4, 8, 16)
    assert {240, 248, 256, 272, 288, 496, 512} <= set(sizes)
    assert not {252, 264, 280, 504, 520, 8192} & set(sizes)
    assert sizes[-1] == 512
    # 3 small sizes + 31 multiples of 8 in [8, 248] + 17 multiples of 16 in [256, 512].
    assert len(sizes) == 51


def test_a_token_budget_below_twice_the_requests_is_itself_a_capture_size():
    # largest = min(128, 512, 100) = 100: multiples of 8 up to 96, then 100 itself.
    expected = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 100)
    assert default_capture_sizes(64, 100) == expected
    assert HarnessConfig.of(max_num_reqs=64, max_num_batched_tokens=100).max_capture_size == 100


def test_a_token_budget_already_on_the_ladder_is_not_added_twice():
    assert default_capture_sizes(64, 96)[-3:] == (80, 88, 96)
    assert default_capture_sizes(2, 3) == (1, 2, 3)


def test_a_token_budget_between_256_and_512_ends_the_sixteen_step_ladder():
    # largest = min(400, 512, 300) = 300: ..., 248, 256, 272, 288, then 300.
    assert default_capture_sizes(200, 300)[-6:] == (240, 248, 256, 272, 288, 300)


def test_explicit_capture_sizes_are_deduplicated_and_sorted():
    config = HarnessConfig.of(capture_sizes=(16, 4, 16, 8, 4))
    assert config.cudagraph_capture_sizes == (4, 8, 16)
    assert config.max_capture_size == 16


@pytest.mark.parametrize("capture_sizes", [None, (8, 16)])
def test_graph_mode_none_captures_no_sizes(capture_sizes):
    config = HarnessConfig.of(cudagraph_mode=NONE, capture_sizes=capture_sizes)
    assert config.cudagraph_capture_sizes == ()
    assert config.max_capture_size == 0


# -- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(("enable_dbo", "ubatch_size"), [(True, 0), (False, 3)])
def test_microbatching_rejects_piecewise_graphs(enable_dbo, ubatch_size):
    assert rejected_field(enable_dbo=enable_dbo, ubatch_size=ubatch_size,
                          cudagraph_mode=PIECEWISE) == "cudagraph_mode"


@pytest.mark.parametrize("mode", [FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE, NONE])
def test_microbatching_accepts_every_mode_but_pure_piecewise(mode):
    config = HarnessConfig.of(enable_dbo=True, cudagraph_mode=mode)
    assert config.serving.cudagraph_mode is mode
    assert config.num_ubatches == 2


def test_piecewise_graphs_are_fine_without_microbatching():
    config = HarnessConfig.of(enable_dbo=False, cudagraph_mode=PIECEWISE)
    assert config.serving.cudagraph_mode is PIECEWISE


@pytest.mark.parametrize("field", ["decode_threshold", "prefill_threshold"])
def test_a_threshold_below_the_microbatch_count_is_rejected(field):
    assert rejected_field(enable_dbo=True, **{field: 1}) == field
    assert rejected_field(enable_dbo=False, ubatch_size=3, **{field: 2}) == field


def test_a_threshold_equal_to_the_microbatch_count_is_accepted():
    assert HarnessConfig.of(enable_dbo=True, decode_threshold=2, prefill_threshold=2)
    assert HarnessConfig.of(enable_dbo=False, ubatch_size=3, decode_threshold=3,
                            prefill_threshold=3)


def test_a_zero_threshold_is_fine_without_microbatching():
    config = HarnessConfig.of(enable_dbo=False, decode_threshold=0, prefill_threshold=0)
    assert config.serving.decode_threshold == 0


@pytest.mark.parametrize(("enable_dbo", "ubatch_size"), [(True, 0), (False, 3)])
def test_microbatching_needs_at_least_two_dp_ranks(enable_dbo, ubatch_size):
    assert rejected_field(dp_size=1, enable_dbo=enable_dbo,
                          ubatch_size=ubatch_size) == "dp_size"


def test_a_single_dp_rank_is_fine_without_microbatching():
    assert HarnessConfig.of(dp_size=1, enable_dbo=False).serving.dp_size == 1


@pytest.mark.parametrize("num_ubatches", [1, 0, -2, True, "2"])
def test_fewer_than_two_microbatches_cannot_be_asked_for(num_ubatches):
    with pytest.raises(ConfigError) as info:
        ubatching_fields(num_ubatches)
    assert info.value.field == "num_ubatches"


def test_a_microbatch_count_maps_onto_vllm_flags():
    assert ubatching_fields(2) == {"enable_dbo": True, "ubatch_size": 0}
    assert ubatching_fields(4) == {"enable_dbo": False, "ubatch_size": 4}


def test_the_num_ubatches_shorthand_builds_a_config_with_that_many_microbatches():
    assert HarnessConfig.from_dict({"num_ubatches": 3}).num_ubatches == 3
    assert HarnessConfig.from_dict({"num_ubatches": 2, "ubatch_size": 5}).num_ubatches == 2
    with pytest.raises(ConfigError) as info:
        HarnessConfig.from_dict({"num_ubatches": 1})
    assert info.value.field == "num_ubatches"


def test_empty_capture_sizes_are_rejected_while_graphs_are_on():
    assert rejected_field(capture_sizes=()) == "capture_sizes"


@pytest.mark.parametrize("bad", [0, -8])
def test_a_non_positive_capture_size_is_rejected(bad):
    assert rejected_field(capture_sizes=(8, bad)) == "capture_sizes"


def test_a_capture_size_above_the_token_budget_is_rejected():
    assert rejected_field(capture_sizes=(8, 257), max_num_batched_tokens=256) == "capture_sizes"
    assert HarnessConfig.of(capture_sizes=(8, 256), max_num_batched_tokens=256).max_capture_size \
        == 256


def test_experts_are_sharded_evenly_over_the_dp_ranks():
    assert HarnessConfig.of(dp_size=3, experts_per_rank=2).num_experts == 6
    assert rejected_field(experts_per_rank=0) == "experts_per_rank"


def test_top_k_cannot_exceed_the_number_of_experts():
    assert rejected_field(dp_size=2, experts_per_rank=2, top_k=5) == "top_k"
    assert HarnessConfig.of(dp_size=2, experts_per_rank=2, top_k=4).model.top_k == 4


@pytest.mark.parametrize("rank", [2, -1])
def test_the_threshold_offset_rank_must_be_a_dp_rank(rank):
    assert rejected_field(dp_size=2, threshold_offset_rank=rank) == "threshold_offset_rank"


def test_the_threshold_offset_moves_only_its_own_rank():
    config = HarnessConfig.of(dp_size=2, decode_threshold=32, threshold_offset_rank=1,
                              threshold_offset=8)
    assert config.decode_threshold_for_rank(0) == 32
    assert config.decode_threshold_for_rank(1) == 40


def test_a_threshold_offset_below_zero_is_rejected():
    assert rejected_field(decode_threshold=4, threshold_offset_rank=0,
                          threshold_offset=-5) == "threshold_offset"


def test_an_unknown_field_is_rejected_by_name():
    with pytest.raises(ConfigError) as info:
        HarnessConfig.from_dict({"dp_size": 2, "max_num_seqs": 8})
    assert info.value.field == "max_num_seqs"


@pytest.mark.parametrize(
    ("field", "value"),
    [("guard", "loose"), ("guard", "MERGED"), ("twins", "some"), ("cudagraph_mode", "eager")],
)
def test_an_unknown_variant_name_is_rejected(field, value):
    with pytest.raises(ConfigError) as info:
        HarnessConfig.from_dict({field: value})
    assert info.value.field == field


def test_variant_names_select_the_variants():
    config = HarnessConfig.from_dict({"guard": "strict-k2", "twins": "reachable"})
    assert config.mutation.guard is Guard.STRICT_K2
    assert config.mutation.twins is Twins.REACHABLE


# -- serialisation -------------------------------------------------------------------------


def _non_default_config() -> HarnessConfig:
    return HarnessConfig.of(dp_size=4, enable_dbo=False, ubatch_size=3, decode_threshold=8,
                            prefill_threshold=64, cudagraph_mode=FULL_AND_PIECEWISE,
                            capture_sizes=(16, 8), max_num_reqs=32, max_num_batched_tokens=128,
                            experts_per_rank=2, top_k=3, seed=7, guard=Guard.MERGED,
                            twins=Twins.REACHABLE, threshold_offset_rank=3, threshold_offset=4)


def test_a_config_survives_a_round_trip_through_a_dict():
    config = _non_default_config()
    data = config.to_dict()
    assert data["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert data["guard"] == "merged"
    assert data["twins"] == "reachable"
    assert data["capture_sizes"] == [16, 8]
    assert HarnessConfig.from_dict(data) == config
    assert HarnessConfig.from_dict(json.loads(json.dumps(data))) == config


def test_a_json_config_file_is_loaded(tmp_path):
    path = tmp_path / "case.json"
    path.write_text(json.dumps({"dp_size": 4, "num_ubatches": 3, "capture_sizes": [8, 16]}))
    config = HarnessConfig.from_dict(load_config_file(path))
    assert (config.serving.dp_size, config.num_ubatches) == (4, 3)
    assert config.cudagraph_capture_sizes == (8, 16)


def test_a_toml_config_file_is_loaded_with_or_without_a_config_table(tmp_path):
    flat = tmp_path / "flat.toml"
    flat.write_text('dp_size = 4\ncudagraph_mode = "FULL_DECODE_ONLY"\nguard = "merged"\n')
    nested = tmp_path / "nested.toml"
    nested.write_text('[config]\ndp_size = 4\ncudagraph_mode = "FULL_DECODE_ONLY"\n'
                      'guard = "merged"\n')
    for path in (flat, nested):
        config = HarnessConfig.from_dict(load_config_file(path))
        assert config.serving.dp_size == 4
        assert config.serving.cudagraph_mode is FULL_DECODE_ONLY
        assert config.mutation.guard is Guard.MERGED


@pytest.mark.parametrize(
    ("name", "text"),
    [("bad.json", '{"dp_size": 2,'), ("bad.toml", "dp_size = = 2"), ("list.json", "[1, 2]")],
)
def test_a_malformed_config_file_is_a_config_error(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    assert info.value.field == "config"


def test_a_missing_config_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config_file(tmp_path / "absent.json")
    assert info.value.field == "config"


def test_only_the_single_rank_gpu_world_admits_one_microbatched_rank():
    with pytest.raises(ConfigError) as exc:
        HarnessConfig.of(dp_size=1)
    assert exc.value.field == "dp_size"
    alone = HarnessConfig.of(dp_size=1, single_rank_gpu_world=True)
    assert alone.num_ubatches == 2 and HarnessConfig.of(**alone.to_dict()) == alone
    with pytest.raises(ConfigError) as exc:
        HarnessConfig.of(dp_size=2, single_rank_gpu_world=True)
    assert exc.value.field == "single_rank_gpu_world"
