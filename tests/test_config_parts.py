"""HarnessConfig in frozen parts: every flat field in exactly one part, the flat wire form
unchanged, and a variant that names only its mutation, undone to Mutation()."""

from __future__ import annotations

from collections import Counter
from dataclasses import fields, replace
from pathlib import Path

import pytest

from harness.config import (
    FLAT_FIELDS,
    HARNESS_DECISION_SWITCHES,
    HARNESS_EXECUTION_SWITCHES,
    Guard,
    HarnessConfig,
    Model,
    Mutation,
    Serving,
    System,
)
from harness.config_parts import PART_OF, PARTS
from harness.errors import ConfigError
from harness.fuzz.variants import EXEC_VARIANTS, SUT_VARIANTS, VARIANTS
from harness.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
ALL_VARIANTS = {**VARIANTS, **SUT_VARIANTS, **EXEC_VARIANTS}

# The flat wire form as files, flags and error lines name it: it must not change.
WIRE_FIELDS = {
    "dp_size", "enable_dbo", "ubatch_size", "decode_threshold", "prefill_threshold",
    "cudagraph_mode", "capture_sizes", "max_num_reqs", "max_num_batched_tokens",
    "decode_query_len", "varlen_decode", "hidden_size", "experts_per_rank", "top_k", "seed",
    "guard", "twins", "threshold_offset_rank", "threshold_offset", "protocol",
    "all2all_backend", "capture_on", "sut", "execution", "vllm_src", "vllm_patches",
    "differential_against_base", "capture_key", "eager_slices", "a2a_buffers", "ubatch_vote",
    "dummy_padding", "query_len_bound", "switch_to_compute", "single_rank_gpu_world",
    "continuation", "lookback_refresh", "idle_step", "dummy_execution", "draft_sync_state",
    "replay_tag", "ids_gather_wait", "staging_restore", "staging_vote", "release",
    "draft_schedule", "verify_slices", "fault_tolerance", "dead_set", "staging"}

# Values for the mutation fields a variant draws per example rather than plants.
DRAWN_MUTATION = {"threshold_offset_rank": 1, "threshold_offset": 4}


def test_every_flat_field_sits_in_exactly_one_part():
    names = Counter(f.name for cls in PARTS.values() for f in fields(cls))
    assert set(names) == WIRE_FIELDS == set(FLAT_FIELDS)
    assert all(count == 1 for count in names.values()), names
    assert [f.name for f in fields(HarnessConfig)] == list(PARTS)


def test_each_part_holds_what_its_name_says():
    assert {f.name for f in fields(Model)} == {"hidden_size", "experts_per_rank", "top_k",
                                               "seed"}
    assert {f.name for f in fields(System)} == {"sut", "execution", "vllm_src", "vllm_patches",
                                                "differential_against_base"}
    assert "guard" in {f.name for f in fields(Mutation)}
    assert "dp_size" in {f.name for f in fields(Serving)}


def test_the_default_config_plants_no_mutation():
    assert HarnessConfig().mutation == Mutation()
    assert Mutation().planted() == ()
    assert Mutation(guard="merged").planted() == ("guard",)
    assert Mutation(guard="merged").guard is Guard.MERGED  # a part parses its wire values


def test_of_routes_each_flat_field_to_its_part():
    config = HarnessConfig.of(dp_size=4, top_k=3, twins="all", execution="vllm")
    assert config.serving == Serving(dp_size=4)
    assert config.model == Model(top_k=3)
    assert config.mutation == Mutation(twins="all")
    assert config.system == System(execution="vllm")


def test_with_changes_changes_only_the_part_of_the_field():
    config = HarnessConfig.of(dp_size=4)
    changed = config.with_changes(guard="merged")
    assert changed.mutation == Mutation(guard="merged")
    assert (changed.serving, changed.model, changed.system) == (
        config.serving, config.model, config.system)
    assert changed.with_changes(dp_size=3).serving.dp_size == 3


def test_an_unknown_flat_field_is_a_type_error_in_code_and_a_config_error_in_a_file():
    with pytest.raises(TypeError, match="no field 'bogus'"):
        HarnessConfig().with_changes(bogus=1)
    with pytest.raises(ConfigError) as info:
        HarnessConfig.from_dict({"bogus": 1})
    assert info.value.field == "bogus"


def test_a_config_of_every_part_round_trips_through_its_flat_dict():
    config = HarnessConfig.of(dp_size=3, enable_dbo=False, ubatch_size=3, capture_sizes=[8, 16],
                              cudagraph_mode="NONE", hidden_size=8, seed=7,
                              protocol="stock", capture_key="first-two", a2a_buffers="unpadded",
                              eager_slices="graph-padded", dummy_padding="unpadded",
                              all2all_backend="deepep_high_throughput", decode_threshold=4,
                              prefill_threshold=4, twins="all", threshold_offset_rank=2,
                              threshold_offset=3)
    data = config.to_dict()
    assert data["capture_sizes"] == [8, 16] and data["cudagraph_mode"] == "NONE"
    assert data["protocol"] == "stock" and data["threshold_offset_rank"] == 2
    assert HarnessConfig.from_dict(data) == config
    assert HarnessConfig.of(**config.flat()) == config
    vllm = HarnessConfig.of(sut="vllm", execution="vllm", vllm_src="/src/vllm",
                            differential_against_base=True, switch_to_compute="no-wait")
    assert HarnessConfig.from_dict(vllm.to_dict()) == vllm
    assert vllm.to_dict()["switch_to_compute"] == "no-wait"


def test_the_fields_of_code_left_untested_stay_out_of_the_flat_dict():
    assert set(HarnessConfig().to_dict()) == WIRE_FIELDS - {
        "vllm_src", "vllm_patches", "differential_against_base", "decode_query_len",
        "varlen_decode", "query_len_bound", "execution", "switch_to_compute", "continuation",
        "lookback_refresh", "idle_step", "dummy_execution", "draft_sync_state", "replay_tag",
        "ids_gather_wait", "staging_restore", "staging_vote", "draft_schedule",
        "verify_slices", "fault_tolerance", "dead_set", "staging"}


@pytest.mark.parametrize("path", sorted([*SCENARIOS.rglob("*.json"), *SCENARIOS.rglob("*.toml")]),
                         ids=lambda p: p.stem)
def test_every_regression_scenarios_config_round_trips(path):
    config = load_scenario(path).config
    assert HarnessConfig.from_dict(config.to_dict()) == config


def test_the_first_bad_field_named_is_the_one_a_flat_config_always_named():
    # Parsed in one order across parts: the guard (a mutation) before the backend (serving).
    for make in (lambda **f: HarnessConfig.of(**f), lambda **f: HarnessConfig.from_dict(f),
                 lambda **f: HarnessConfig().with_changes(**f)):
        with pytest.raises(ConfigError) as info:
            make(all2all_backend="nope", guard="nope")
        assert info.value.field == "guard"
        with pytest.raises(ConfigError) as info:
            make(capture_sizes="nope", eager_slices="nope")
        assert info.value.field == "eager_slices"
        with pytest.raises(ConfigError) as info:
            make(switch_to_compute="nope", sut="nope")
        assert info.value.field == "sut"


def test_the_switches_of_the_harnesss_own_code_come_from_the_mutation():
    assert HARNESS_DECISION_SWITCHES == ("guard", "twins", "threshold_offset_rank",
                                         "ubatch_vote", "query_len_bound", "staging_vote",
                                         "draft_sync_state", "dead_set")
    assert HARNESS_EXECUTION_SWITCHES == ("protocol", "capture_on", "capture_key",
                                          "eager_slices", "dummy_padding", "staging_restore",
                                          "continuation",
                                          "lookback_refresh", "idle_step", "dummy_execution",
                                          "replay_tag", "verify_slices")
    with pytest.raises(ConfigError, match="^query_len_bound: switches the harness's own "
                                          "decision code"):
        HarnessConfig.of(sut="vllm", query_len_bound="rank-local")


@pytest.mark.parametrize("name", sorted(ALL_VARIANTS))
def test_a_variant_names_its_mutation_apart_from_its_setting(name):
    variant = ALL_VARIANTS[name]
    assert all(PART_OF[field] != "mutation" for field, _ in variant.setting)
    assert set(variant.under_test) <= {field for field, _ in variant.setting}
    planted = dict(variant.changes)
    assert {f for f in planted if PART_OF[f] == "mutation"} == set(variant.mutation.planted())
    assert HarnessConfig.of(**planted).mutation == variant.mutation


@pytest.mark.parametrize("name", sorted(ALL_VARIANTS))
def test_a_variants_undo_gives_no_mutation_and_the_harnesss_own_code_under_test(name):
    variant = ALL_VARIANTS[name]
    drawn = {f: DRAWN_MUTATION[f] for f, _ in variant.drawn if PART_OF[f] == "mutation"}
    config = HarnessConfig.of(**dict(variant.changes), **drawn)
    undone = config.with_changes(**dict(variant.undo))
    assert undone.mutation == Mutation()
    assert all(getattr(undone.system, f) == getattr(System(), f) for f in variant.under_test)
    assert (undone.serving, undone.model) == (config.serving, config.model)


def test_the_undo_of_a_planted_switch_is_that_switch_at_its_reference():
    assert VARIANTS["guard-merged"].undo == (("guard", "fixed"),)
    assert VARIANTS["asymmetric-candidates"].undo == (("threshold_offset_rank", None),
                                                      ("threshold_offset", 0))
    assert SUT_VARIANTS["vllm"].undo == (("sut", "harness"),)
    assert EXEC_VARIANTS["vllm-exec-hang"].undo == (("execution", "harness"),)
    assert EXEC_VARIANTS["ht-missing-compute-wait"].undo == (("switch_to_compute", "sync"),)
    assert EXEC_VARIANTS["ht-missing-compute-wait"].changes == (
        ("sut", "vllm"), ("execution", "vllm"), ("switch_to_compute", "no-wait"))
    assert EXEC_VARIANTS["ids-gather-early-wait"].undo == (("ids_gather_wait",
                                                            "after-routing"),)


def test_a_part_replaced_whole_is_validated_with_the_others():
    with pytest.raises(ConfigError) as info:
        replace(HarnessConfig(), mutation=Mutation(threshold_offset_rank=5))
    assert info.value.field == "threshold_offset_rank"
