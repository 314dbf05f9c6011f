"""Whether a finding is the outcome the fuzzer wants: one rule for every report output."""

from __future__ import annotations

from collections.abc import Iterable

from harness.fuzz.run_log import FindingEntry
from harness.fuzz.variants import expects_a_finding

PASS, MISSED, FOUND_ON_REFERENCE = "pass", "MISSED", "FOUND-ON-REFERENCE"


def finding_passes(entry: FindingEntry) -> bool:
    """The reference passes when nothing is found; a bug variant when its bug is found."""
    return entry.found == expects_a_finding(entry.variant)


def finding_outcome(entry: FindingEntry) -> str:
    """pass, MISSED (a planted bug not found) or FOUND-ON-REFERENCE (a real failure)."""
    if finding_passes(entry):
        return PASS
    return MISSED if expects_a_finding(entry.variant) else FOUND_ON_REFERENCE


def variant_order(variants: Iterable[str]) -> list[str]:
    """The reference first, then the bug variants by name, each once."""
    return sorted(set(variants), key=lambda v: (expects_a_finding(v), v))


def summary_line(findings: Iterable[FindingEntry], num_examples: int) -> str:
    outcomes = [finding_outcome(f) for f in findings]
    return (f"{len(outcomes)} findings: {outcomes.count(PASS)} pass, "
            f"{outcomes.count(MISSED)} missed, {outcomes.count(FOUND_ON_REFERENCE)} found on "
            f"the reference; {num_examples} examples")
