"""A planted bug hunted without its steering: `unsteered` keeps the bug and hands every field
that narrows the search back to the reference; a fault the reference never draws is said, not
faked; and a real hunt on the sim world finds a decision bug that way."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest
from hypothesis import strategies as st

from harness.config_parts import POLICIES, Mutation, System
from harness.faults import FaultKind
from harness.fuzz.unsteered import (
    BUG_FIELDS,
    REFERENCE,
    SPLIT_FIELDS,
    STEERING_FIELDS,
    faults_never_drawn,
    reference_fault_note,
    unsteered,
)
from harness.fuzz.variants import EXEC_VARIANTS, VARIANTS, Variant, reference_for

# Every field set away from the reference's: a steering value that leaks through shows.
FULLY_STEERED = Variant(
    "fully-steered", "a bug with every kind of steering", mutation=Mutation(guard="merged"),
    setting=(("execution", "vllm"), ("cudagraph_mode", "FULL")), under_test=("execution",),
    caught_by=("no_empty_region",), ubatch_counts=(3,), fault_kinds=(FaultKind.SKIP_SYNC,),
    fault_every=1, drafts_every=2,
    drawn=(("threshold_offset", st.just(3)), ("capture_sizes", st.just([8, 16]))),
    hunt=("no_empty_region",), min_steps=2)
# What the search reads to narrow toward a bug (harness/fuzz/engine.py scenario_strategy and
# the hunt filter), named here so that no reclassification can quietly keep one.
SEARCH_NARROWING = ("ubatch_counts", "fault_kinds", "fault_every", "drafts_every", "hunt")
BUGS = [v for v in (*VARIANTS.values(), *EXEC_VARIANTS.values()) if not v.is_reference]


def test_every_field_of_a_variant_is_classified_as_bug_or_steering():
    classified = (*BUG_FIELDS, *STEERING_FIELDS, *SPLIT_FIELDS)
    assert len(classified) == len(set(classified)), "a field classified twice"
    names = [f.name for f in fields(Variant)]
    unclassified = [name for name in names if name not in classified]
    assert not unclassified, f"classify in harness/fuzz/unsteered.py: {unclassified}"
    assert set(classified) <= set(names)


def test_unsteered_keeps_each_bug_field_and_takes_each_steering_field_from_the_reference():
    hunted = unsteered(FULLY_STEERED)
    reference = reference_for(FULLY_STEERED.setting)  # under vLLM's execution, its search there
    for f in fields(Variant):
        if f.name in BUG_FIELDS:
            assert getattr(hunted, f.name) == getattr(FULLY_STEERED, f.name), f.name
        elif f.name in STEERING_FIELDS:
            assert getattr(hunted, f.name) == getattr(reference, f.name), f.name
    # Of the split fields, only the system under test and the bug's own switches stay.
    assert hunted.setting == (("execution", "vllm"),)
    assert [name for name, _ in hunted.drawn] == [
        *(name for name, _ in reference.drawn), "threshold_offset"]


def test_nothing_the_search_narrows_with_survives_unsteering():
    hunted = unsteered(FULLY_STEERED)
    for name in SEARCH_NARROWING:
        assert getattr(hunted, name) == getattr(reference_for(FULLY_STEERED.setting), name), \
            f"{name} leaked through"
    assert {n for n, _ in hunted.setting} <= {*(f.name for f in fields(System)), *POLICIES}
    own = hunted.drawn[len(reference_for(FULLY_STEERED.setting).drawn):]
    assert {n for n, _ in own} <= {f.name for f in fields(Mutation)}


@pytest.mark.parametrize("variant", BUGS, ids=lambda v: v.name)
def test_every_bug_unsteered_plants_the_same_bug_under_the_references_search(variant):
    hunted = unsteered(variant)
    assert hunted.mutation == variant.mutation and hunted.caught_by == variant.caught_by
    lives_in = {*(f.name for f in fields(System)), *POLICIES}
    assert hunted.changes == tuple((n, v) for n, v in variant.changes
                                   if n in lives_in or n in variant.mutation.planted())
    assert hunted.undo == variant.undo  # the same switches take the bug out again
    reference = reference_for(variant.setting)
    for name in SEARCH_NARROWING:
        kept = name == "hunt" and variant.hunts_a_shipped_class
        assert getattr(hunted, name) == getattr(variant if kept else reference, name), name


@pytest.mark.parametrize("name", ["vllm-exec-hang", "vllm-exec-crash", "ht-missing-compute-wait",
                                  "ids-gather-early-wait"])
def test_each_vllm_execution_bug_unsteered_keeps_its_code_and_draws_the_references_faults(name):
    variant = EXEC_VARIANTS[name]
    hunted = unsteered(variant)
    assert dict(hunted.setting) == {"sut": "vllm", "execution": "vllm"}
    assert hunted.mutation == variant.mutation and hunted.caught_by == variant.caught_by
    assert set(variant.fault_kinds) <= set(hunted.fault_kinds)  # the reference draws them all
    assert reference_fault_note(variant) == ""
    # Its own pins (eager, thresholds 4, an overlap style) are gone: the reference's stay.
    assert hunted.drawn == reference_for(variant.setting).drawn
    # #55586's two failures are told apart by class, as the plain search hunts them; a
    # planted slip is hunted with no filter.
    assert hunted.hunt == (variant.hunt if not variant.mutation.planted() else None)


def test_a_class_filter_is_kept_only_for_a_hunt_of_code_as_it_ships():
    assert EXEC_VARIANTS["vllm-exec-hang"].hunts_a_shipped_class
    assert not EXEC_VARIANTS["ht-missing-compute-wait"].hunts_a_shipped_class  # planted
    assert not EXEC_VARIANTS["vllm-exec"].hunts_a_shipped_class  # the fault-free reference
    assert not FULLY_STEERED.hunts_a_shipped_class  # planted, hunted by one checker
    assert unsteered(FULLY_STEERED).hunt is None


@pytest.mark.parametrize("name", ["staging-restore-permuted", "staging-rank-local"])
def test_a_staging_slip_unsteered_keeps_the_staging_policy_it_lives_under(name):
    # Without the policy the slip is inert: the reference would hunt a bug that is not there.
    hunted = unsteered(VARIANTS[name])
    assert dict(hunted.setting) == {"staging": True} and hunted.drawn == REFERENCE.drawn
    assert dict(hunted.changes)["staging"] is True


def test_a_bug_drawn_as_its_mutation_keeps_those_draws():
    hunted = unsteered(VARIANTS["asymmetric-candidates"])
    assert [n for n, _ in hunted.drawn] == ["threshold_offset_rank", "threshold_offset"]
    assert unsteered(VARIANTS["idle-rank-dummy-unpadded"]).drawn == ()


def test_a_fault_the_reference_never_draws_is_said_not_injected():
    stock = VARIANTS["stock-protocol"]
    assert stock.fault_kinds[0] in REFERENCE.fault_kinds  # the reference draws its fault
    assert faults_never_drawn(stock) == () and reference_fault_note(stock) == ""
    no_faults = replace(REFERENCE, fault_kinds=())
    assert reference_fault_note(stock, no_faults) == "needs a fault the reference never draws"
    assert unsteered(stock, no_faults).fault_kinds == ()
    assert reference_fault_note(FULLY_STEERED) == "needs a fault the reference never draws"
    both = replace(stock, fault_kinds=(FaultKind.RAISE_IN_UBATCH, FaultKind.SKIP_SYNC))
    assert reference_fault_note(both) == "the reference never draws skip_sync"


def test_a_real_unsteered_hunt_on_the_sim_world_finds_a_decision_bug_as_itself():
    from harness.bench.detection import UNSTEERED, detection_rows

    # Seed 0 finds it at its 4th example (under 3 s on a loaded 2-core machine); the budget
    # leaves room. Drifted draws would still find it: 7 of 7 seeds tried did, within 32.
    rows = detection_rows("sim", [0], 20.0, names=("asymmetric-candidates",),
                          columns=(UNSTEERED,))
    assert [(row.variant, row.column) for row in rows] == [("asymmetric-candidates",
                                                           UNSTEERED)]
    assert rows[0].detections == ("found",), rows[0]
    assert rows[0].seconds[0] is not None and rows[0].examples[0] >= 1
