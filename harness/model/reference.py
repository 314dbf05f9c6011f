"""Single-process reference for the miniature MoE step: the whole global batch of all ranks,
token by token, no microbatches, no process group, experts called directly.

It knows nothing about slices or padding, so a distributed run that attributes a token to the
wrong microbatch or request (spec §7.1/§7.2), loses or repeats a receive (spec §7.3/§7.4), or lets a
padding row leak differs from it on a real row, a state row or a route.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harness.config import HarnessConfig
from harness.model.state import RequestSpec
from harness.model.weights import DTYPE, MoEWeights, expert_mlp

Route = tuple[int, int, int]  # (source rank, token index in that rank's step, expert)


@dataclass(frozen=True)
class ReferenceStep:
    outputs: list[torch.Tensor]  # per rank: [real tokens, H]
    states: list[torch.Tensor]  # per rank: the whole state cache after the step
    routes: list[Counter[Route]]  # per destination rank: the routes it must receive


def reference_step(config: HarnessConfig, weights: MoEWeights,
                   batches: Sequence[Sequence[RequestSpec]],
                   initial_states: Sequence[torch.Tensor]) -> ReferenceStep:
    """Compute every rank's real output rows and final state from scratch."""
    if len(batches) != len(initial_states):
        raise ValueError("one initial state per rank is needed")
    w = weights
    outputs, states = [], []
    routes: list[Counter[Route]] = [Counter() for _ in range(config.serving.dp_size)]
    for rank, requests in enumerate(batches):
        state = initial_states[rank].clone()
        hidden = _attention(config, w, requests, state)
        outputs.append(hidden + _moe(config, w, hidden, rank, routes))
        states.append(state)
    return ReferenceStep(outputs, states, routes)


def _attention(config: HarnessConfig, w: MoEWeights, requests: Sequence[RequestSpec],
               state: torch.Tensor) -> torch.Tensor:
    """Each token reads its request's cached state plus the embeddings of the request's
    earlier tokens, scaled by its position; then each request's state absorbs its tokens."""
    if not requests:
        return torch.zeros(0, config.model.hidden_size, dtype=DTYPE)
    lens = torch.tensor([r.query_len for r in requests])
    owner = torch.repeat_interleave(torch.arange(len(requests)), lens)  # request of each token
    emb = w.embedding[[t for r in requests for t in r.token_ids]]
    before = emb.cumsum(0) - emb
    first = lens.cumsum(0) - lens  # each request's first token
    seen = before - before[first][owner]
    slots = torch.tensor([r.slot for r in requests])[owner]
    pos = torch.tensor([p for r in requests for p in r.positions()], dtype=DTYPE).unsqueeze(1)
    context = state[slots] + seen
    hidden = (emb + torch.sin(pos * w.pos_freq) + torch.cos(pos * w.pos_freq)
              + torch.tanh((context @ w.state_proj) / (pos + 1)))
    state.index_add_(0, slots, emb)
    return hidden


def _moe(config: HarnessConfig, w: MoEWeights, hidden: torch.Tensor, rank: int,
         routes: list[Counter[Route]]) -> torch.Tensor:
    """Every token to its top-k experts, called directly; no buffers, no all-to-all."""
    values, ids = (hidden @ w.router).topk(config.model.top_k, dim=-1)
    gates = torch.softmax(values, dim=-1)
    out = torch.zeros_like(hidden)
    for token, experts in enumerate(ids.tolist()):
        for expert in experts:
            routes[expert // config.model.experts_per_rank][(rank, token, expert)] += 1
    for expert in set(ids.flatten().tolist()):
        chosen = ids == expert  # [T, k]
        rows = chosen.any(dim=1)
        gate = (gates * chosen).sum(dim=1, keepdim=True)[rows]
        out[rows] += gate * expert_mlp(hidden[rows], w.w1[expert], w.w2[expert])
    return out


def mismatched_rows(got: torch.Tensor, want: torch.Tensor, atol: float) -> list[int]:
    """Rows of `want` that `got` lacks or misses by more than `atol` in some column (NaN never
    matches); rows of `got` past those of `want` are not looked at."""
    n = min(got.shape[0], want.shape[0])
    close = (torch.isclose(got[:n], want[:n], atol=atol, rtol=0).all(dim=1) if n
             else torch.ones(0, dtype=torch.bool))
    return (~close).nonzero().flatten().tolist() + list(range(n, want.shape[0]))


def diff_against_reference(ref: ReferenceStep, outputs: Sequence[torch.Tensor],
                           states: Sequence[torch.Tensor], atol: float = 1e-9) -> list[str]:
    """Every real row and real state row that differs (per rank); an empty list is a match.

    `outputs[r]` holds rank r's output rows (at least its real ones; padding rows past them
    are ignored); `states[r]` its state cache, of which only the real slots are compared."""
    problems = []
    for rank, (want, got) in enumerate(zip(ref.outputs, outputs, strict=True)):
        n = want.shape[0]
        if got.shape[0] < n:
            problems.append(f"rank {rank}: {got.shape[0]} output rows, {n} real tokens")
            continue
        problems += [f"rank {rank}: output row {i} differs"
                     for i in mismatched_rows(got, want, atol)]
    for rank, (want, got) in enumerate(zip(ref.states, states, strict=True)):
        real = want.shape[0] - 1  # the last row is the scratch slot
        problems += [f"rank {rank}: state slot {s} differs"
                     for s in mismatched_rows(got[:real], want[:real], atol)]
    return problems
