"""Whether a finding is the outcome the fuzzer wants: one rule for every report output, the
fuzzer's own (harness/fuzz/variants.py): a planted bug counts only when found as itself."""

from __future__ import annotations

from collections.abc import Iterable

from harness.fuzz.run_log import FindingEntry
from harness.fuzz.variants import NOT_FOUND, did_its_job, expects_a_finding, variant_detection

PASS, MISSED, FOUND_ON_REFERENCE = "pass", "MISSED", "FOUND-ON-REFERENCE"


def finding_passes(entry: FindingEntry) -> bool:
    """The reference passes when nothing is found; a bug variant when its bug is found by a
    checker that names it."""
    return did_its_job(entry.variant, entry.found, entry.checker)


def finding_outcome(entry: FindingEntry) -> str:
    """pass, MISSED (a planted bug not found), "found as X" (a planted bug shown by checker X,
    which does not name it: a miss too) or FOUND-ON-REFERENCE (a real failure)."""
    if finding_passes(entry):
        return PASS
    if not expects_a_finding(entry.variant):
        return FOUND_ON_REFERENCE
    shown = variant_detection(entry.variant, entry.found, entry.checker)
    return MISSED if shown == NOT_FOUND else shown


def finding_kind(entry: FindingEntry) -> str | None:
    """None when nothing was found; "reproducible", or "intermittent (r/N)"."""
    if not entry.found:
        return None
    runs = entry.intermittency
    return runs.label if runs else "reproducible"


def variant_order(variants: Iterable[str]) -> list[str]:
    """The reference first, then the bug variants by name, each once."""
    return sorted(set(variants), key=lambda v: (expects_a_finding(v), v))


def summary_line(findings: Iterable[FindingEntry], num_examples: int) -> str:
    entries = list(findings)
    outcomes = [finding_outcome(f) for f in entries]
    passed, on_reference = outcomes.count(PASS), outcomes.count(FOUND_ON_REFERENCE)
    missed = len(outcomes) - passed - on_reference
    found_as = sum(f.found and o not in (PASS, FOUND_ON_REFERENCE)
                   for f, o in zip(entries, outcomes, strict=True))
    intermittent = sum(f.intermittency is not None for f in entries)
    return (f"{len(outcomes)} findings: {passed} pass, {missed} missed"
            f"{f' ({found_as} found as another checker)' if found_as else ''}, "
            f"{on_reference} found on the reference"
            f"{f', {intermittent} intermittent' if intermittent else ''}; "
            f"{num_examples} examples")
