"""Collectives as the rank code issues them, on any torch process group, always bounded."""

from __future__ import annotations

from datetime import timedelta

import torch


class CollectiveTimeout(RuntimeError):
    """A collective did not complete within its bound (a peer skipped it, died or is stuck)."""


def all_reduce_sum(group, tensor: torch.Tensor, timeout_s: float) -> torch.Tensor:
    """SUM all-reduce in place over `group`; the same call in every world."""
    work = group.allreduce([tensor])
    try:
        work.wait(timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        raise CollectiveTimeout(f"all_reduce of {tuple(tensor.shape)} did not complete: "
                                f"{str(exc).splitlines()[0]}") from exc
    return tensor
