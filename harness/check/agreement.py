"""Cross-rank agreement: every rank must take the same decision for a step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.history.decision import StepPlan


@dataclass(frozen=True)
class Disagreement:
    field: str
    values: dict[int, object]  # rank -> value, for every rank

    def describe(self) -> str:
        groups: dict[str, list[int]] = {}
        for rank, value in self.values.items():
            groups.setdefault(repr(value), []).append(rank)
        parts = [f"ranks {ranks} have {value}" for value, ranks in groups.items()]
        return f"{self.field} differs: " + "; ".join(parts)


def first_disagreement(plans: Sequence[StepPlan]) -> Disagreement | None:
    """The first agreement field on which some rank differs from rank 0, or None."""
    keys = [p.agreement_key() for p in plans]
    for name in keys[0]:
        values = {p.rank: key[name] for p, key in zip(plans, keys, strict=True)}
        if len({repr(v) for v in values.values()}) > 1:
            return Disagreement(name, values)
    return None
