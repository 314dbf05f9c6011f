"""What a rank decided for a step: the graph descriptor, the DP state the ranks agreed on, the
microbatch regions, and the rank's plan. Plain frozen data; the deciding lives in `sut`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.config import CudaGraphMode


@dataclass(frozen=True)
class GraphDescriptor:
    """How a step runs: the key of a captured graph, or an eager run (cg_mode NONE).

    LoRA is unsupported with microbatching (docs/spec.md §0.3), so there is no LoRA field.
    """

    cg_mode: CudaGraphMode
    num_tokens: int
    num_reqs: int | None = None  # None: no request padding (PIECEWISE)
    uniform_token_count: int | None = None  # None: any per-request query length
    max_query_len: int | None = None
    num_ubatches: int = 1  # 1 means no splitting

    @property
    def microbatched(self) -> bool:
        return self.num_ubatches > 1

    def label(self) -> str:
        parts = [self.cg_mode.name, f"{self.num_tokens}tok"]
        if self.num_reqs is not None:
            parts.append(f"{self.num_reqs}req")
        if self.uniform_token_count is not None:
            parts.append(f"uct{self.uniform_token_count}")
        if self.max_query_len is not None:
            parts.append(f"mql{self.max_query_len}")
        if self.num_ubatches > 1:
            parts.append(f"ub{self.num_ubatches}")
        return "/".join(parts)


# The label's parts after the mode, and the descriptor field each sets.
_LABEL_PART = re.compile(r"(?P<n1>\d+)(?P<s1>tok|req)|(?P<s2>uct|mql|ub)(?P<n2>\d+)")
_LABEL_FIELDS = {"tok": "num_tokens", "req": "num_reqs", "uct": "uniform_token_count",
                 "mql": "max_query_len", "ub": "num_ubatches"}


def descriptor_of_label(label: str) -> GraphDescriptor:
    """The descriptor whose `label()` is `label`, so a saved record's graphs can be judged
    again; anything else raises ValueError naming the part that does not fit."""
    mode, *parts = label.split("/")
    if mode not in CudaGraphMode.__members__:
        raise ValueError(f"graph label {label!r}: {mode!r} is no CUDA graph mode")
    fields: dict[str, int] = {}
    for part in parts:
        found = _LABEL_PART.fullmatch(part)
        if found is None:
            raise ValueError(f"graph label {label!r}: {part!r} is no descriptor field")
        suffix = found["s1"] or found["s2"]
        fields[_LABEL_FIELDS[suffix]] = int(found["n1"] or found["n2"])
    if "num_tokens" not in fields:
        raise ValueError(f"graph label {label!r} names no token count")
    desc = GraphDescriptor(CudaGraphMode[mode], **fields)
    if desc.label() != label:  # a field twice or out of order, or ub1 written out
        raise ValueError(f"graph label {label!r} is not as a descriptor writes it")
    return desc


@dataclass(frozen=True)
class DpSyncState:
    """What the ranks agreed on; every field is identical on every rank by construction."""

    num_tokens_across_dp: tuple[int, ...]
    uniform_token_count: int | None
    eager: bool
    num_reqs: int
    # Every rank allows skipping this step's drafts (vLLM's skip_drafts row, §1.6).
    skip_drafts: bool = False
    # Guard staged (§3.4): every rank's real tokens when the step is staged, else None.
    staged_tokens: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Region:
    """One microbatch region of one rank: its padded size and the real tokens inside it."""

    tokens: int
    real_tokens: int


@dataclass(frozen=True)
class StepPlan:
    rank: int
    desc: GraphDescriptor
    state: DpSyncState | None
    num_tokens: int  # after DP and graph padding
    num_reqs: int  # after request padding (FULL graphs pad requests)
    real_tokens: int
    regions: tuple[Region, ...]  # one per microbatch; empty when not microbatched

    @property
    def eager(self) -> bool:
        return self.state is None or self.state.eager

    @property
    def uniform_token_count(self) -> int | None:
        return self.state.uniform_token_count if self.state else self.desc.uniform_token_count

    @property
    def kind(self) -> str:
        """eager | eager-microbatched | piecewise | full | full-microbatched."""
        mode = self.desc.cg_mode
        if mode is CudaGraphMode.NONE:
            return "eager-microbatched" if self.desc.microbatched else "eager"
        if mode is CudaGraphMode.PIECEWISE:
            return "piecewise"
        return "full-microbatched" if self.desc.microbatched else "full"

    def agreement_key(self) -> dict[str, object]:
        """The fields every rank must share (invariants 1, 2 and 4 of docs/spec.md §8).

        An eager descriptor keeps the rank's own request count, and a plain eager step also
        its own token count (nothing is padded), so those are left out there.
        """
        desc = self.desc
        return {
            "cg_mode": desc.cg_mode.name,
            "num_tokens": None if self.kind == "eager" else desc.num_tokens,
            "num_ubatches": desc.num_ubatches,
            "uniform_token_count": desc.uniform_token_count,
            "graph_num_reqs": None if desc.cg_mode is CudaGraphMode.NONE else desc.num_reqs,
            "skip_drafts": self.state and self.state.skip_drafts,
            "dp_sync": self.state,
            "region_sizes": tuple(r.tokens for r in self.regions),
        }

    def empty_regions(self) -> tuple[int, ...]:
        """Regions of a FULL microbatched replay that hold no real token (the guard's case)."""
        if self.kind != "full-microbatched":
            return ()
        return tuple(i for i, r in enumerate(self.regions) if r.real_tokens == 0)
