"""A planted bug hunted without its steering: the bug switched on, searched for by exactly the
strategies a user's `fuzz` runs with the reference variant (the reference column of the
detection table in `make bench`)."""

from __future__ import annotations

from dataclasses import fields, replace

from harness.config_parts import POLICIES, Mutation, System
from harness.faults import FaultKind
from harness.fuzz.variants import VARIANTS, Variant, reference_for

# The bug: what is planted, where, and the checkers that name it. Kept from the variant.
BUG_FIELDS = ("name", "summary", "mutation", "under_test", "caught_by", "min_steps",
              "min_ranks")
# Steering: how the search narrows toward the bug. Taken from the reference.
STEERING_FIELDS = ("ubatch_counts", "fault_kinds", "fault_every", "drafts_every", "hunt")
# Partly the bug: only their entries naming the system under test or a bug switch are kept.
SPLIT_FIELDS = ("setting", "drawn")
REFERENCE = VARIANTS["reference"]


def unsteered(variant: Variant, reference: Variant | None = None) -> Variant:
    """`reference` (by default the one for `variant`'s setting: under vLLM's execution, the
    reference's search there, harness/fuzz/variants.py `reference_for`) given `variant`'s bug
    and nothing of its steering.

    The bug, kept: `mutation` (the switch planted); `under_test` and the entries of `setting`
    that are fields of System (`sut`, `execution`, ...: the vLLM code the bug lives in) or
    serving POLICIES (`staging`: the policy a staging slip lives under); any other setting
    field is a config pin, so steering; the entries of
    `drawn` that are Mutation fields (asymmetric-candidates draws its mutation: without them
    nothing is planted); `caught_by` (the checkers detection judges by; the search draws
    nothing from it, it only names the checker reported when several fail on one example);
    `name`, `summary`; `min_steps`, `min_ranks` (what the shrunk failure needs; the search
    reads neither).

    Steering, the reference's: `ubatch_counts`, `drafts_every`, the config fields `drawn`
    narrows (graph modes, capture sizes, drafts), `fault_kinds` and `fault_every` (a
    protocol bug must show under the reference's own fault draws: `reference_fault_note`),
    and `hunt` (a filter on which checkers' failures count), except for a bug of vLLM's code
    as it ships (`Variant.hunts_a_shipped_class`)."""
    reference = reference or reference_for(variant.setting)
    lives_in = {*(f.name for f in fields(System)), *POLICIES}
    switches = {f.name for f in fields(Mutation)}
    bug = {name: getattr(variant, name) for name in BUG_FIELDS}
    return replace(
        reference, **bug,
        setting=(*reference.setting, *((n, v) for n, v in variant.setting if n in lives_in)),
        drawn=(*reference.drawn, *((n, s) for n, s in variant.drawn if n in switches)),
        hunt=variant.hunt if variant.hunts_a_shipped_class else reference.hunt)


def faults_never_drawn(variant: Variant, reference: Variant | None = None
                       ) -> tuple[FaultKind, ...]:
    """The faults `variant`'s own search injects that the reference's never draws."""
    reference = reference or reference_for(variant.setting)
    return tuple(kind for kind in variant.fault_kinds if kind not in reference.fault_kinds)


def reference_fault_note(variant: Variant, reference: Variant | None = None) -> str:
    """What a row hunted by the reference must say of its faults ("" when it draws them all)."""
    missing = faults_never_drawn(variant, reference)
    if not missing:
        return ""
    if len(missing) == len(variant.fault_kinds):
        return "needs a fault the reference never draws"
    return f"the reference never draws {', '.join(kind.value for kind in missing)}"
