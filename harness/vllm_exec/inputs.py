"""The miniature's side of vLLM's model interface: its model state (attention metadata per
microbatch, in persistent buffers as a graph-capable attention backend keeps them), its one
KV-cache group, dummy block tables, and a step's InputBatch laid out as vLLM's
`model_runner.prepare_inputs` lays it out (real requests first, then padding).

These are the model's, not stand-ins: the miniature is the model vLLM's runner runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import numpy as np
import torch
from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers

from harness.batch import RankBatch, dummy_query_lens
from harness.model.state import RequestSpec
from harness.vllm_exec.model import LAYER, AttnMeta

# One KV-cache group holding the miniature's one attention layer (build_slot_mappings_by_layer).
KV_CACHE_CONFIG = SimpleNamespace(kv_cache_groups=[SimpleNamespace(layer_names=[LAYER])],
                                  num_blocks=1)
ATTN_GROUPS: list = [[]]


class DummyBlockTables:
    """The miniature keeps no KV blocks: block tables and slot mappings are zero."""

    cp_size = 1

    def __init__(self, max_num_reqs: int, max_num_tokens: int, device: torch.device) -> None:
        self.tables = (torch.zeros(max_num_reqs, 1, dtype=torch.int32, device=device),)
        self.slots = torch.zeros(1, max_num_tokens, dtype=torch.int64, device=device)

    def get_dummy_block_tables(self, num_reqs: int) -> tuple[torch.Tensor, ...]:
        return tuple(t[:num_reqs] for t in self.tables)

    def get_dummy_slot_mappings(self, num_tokens: int) -> torch.Tensor:
        return self.slots[:, :num_tokens]


class MiniModelState:
    """`prepare_attn` copies a (sub-)batch's metadata into the buffers of its microbatch
    (index `ubatch_idx`; the whole step uses its own), so a captured graph reads fresh
    metadata at replay; `for_capture` maps every request to the scratch slot."""

    max_model_len = 1 << 20

    def __init__(self, max_num_reqs: int, num_ubatches: int, scratch_slot: int,
                 device: torch.device) -> None:
        self.scratch_slot = scratch_slot
        ints = {"dtype": torch.int64, "device": device}
        self._metas = [AttnMeta(torch.zeros(max_num_reqs + 1, **ints),
                                torch.zeros(max_num_reqs, **ints),
                                torch.full((max_num_reqs,), scratch_slot, **ints))
                       for _ in range(max(num_ubatches, 1) + 1)]

    def prepare_dummy_inputs(self, num_reqs: int, num_tokens: int) -> dict:
        return {}

    def prepare_inputs(self, input_batch: InputBatch, req_states: object) -> dict:
        return {}

    def prepare_attn(self, input_batch: InputBatch, cudagraph_mode, block_tables,
                     slot_mappings, attn_groups, kv_cache_config, for_capture: bool = False,
                     ubatch_idx: int | None = None) -> dict[str, AttnMeta]:
        # The whole step's metadata lives past the microbatches'.
        meta = self._metas[-1 if ubatch_idx is None else ubatch_idx]
        num_reqs = input_batch.num_reqs_after_padding
        qsl = meta.query_start_loc[:num_reqs + 1]
        qsl.copy_(input_batch.query_start_loc[:num_reqs + 1])
        meta.seq_lens[:num_reqs].copy_(input_batch.seq_lens[:num_reqs])
        slots = meta.slot_ids[:num_reqs]
        if for_capture:
            slots.fill_(self.scratch_slot)
        else:
            slots.copy_(input_batch.idx_mapping[:num_reqs])
        return {LAYER: AttnMeta(qsl, meta.seq_lens[:num_reqs], slots)}


def whole_step_attn(state: MiniModelState, input_batch: InputBatch, for_capture: bool = False
                    ) -> dict[str, AttnMeta]:
    """The whole step's metadata (no microbatches)."""
    return state.prepare_attn(input_batch, None, (), None, ATTN_GROUPS, KV_CACHE_CONFIG,
                              for_capture=for_capture, ubatch_idx=None)


def step_input_batch(buffers: InputBuffers, requests: Sequence[RequestSpec], num_tokens: int,
                     num_reqs: int, scratch_slot: int, device: torch.device,
                     verified: RankBatch | None = None) -> InputBatch:
    """The InputBatch of a step padded to `num_tokens` / `num_reqs`, written into `buffers`
    (on `device`; the `_np` and `_cpu` fields stay on the host, as vLLM keeps them). A rank
    with no request runs a dummy batch of scratch requests, every token padding, as vLLM's
    dummy run does. A `verified` batch whose drafts adaptive verification trimmed is laid out
    as 0.34's model runner does: the untrimmed counts in num_scheduled_tokens, the even host
    layout in query_start_loc_np, the device's own on the device (docs/spec.md §1.6)."""
    dummy = not requests
    if dummy:
        requests = [RequestSpec(scratch_slot, 0, (0,) * q)
                    for q in dummy_query_lens(num_reqs, num_tokens)]
    ids = [t for r in requests for t in r.token_ids]
    n, m = len(ids), len(requests)
    pad = num_tokens - n
    buffers.input_ids[:num_tokens].copy_(torch.tensor(ids + [0] * pad, dtype=torch.int32))
    positions = [p for r in requests for p in r.positions()]
    buffers.positions[:num_tokens].copy_(torch.tensor(positions + [0] * pad, dtype=torch.int64))
    buffers.is_padding[:num_tokens].copy_(torch.arange(num_tokens) >= (0 if dummy else n))
    query_lens = np.array([r.query_len for r in requests], dtype=np.int32)
    starts = np.zeros(num_reqs + 1, dtype=np.int32)
    np.cumsum(query_lens, out=starts[1:m + 1])
    starts[m + 1:] = n
    buffers.query_start_loc[:num_reqs + 1].copy_(torch.from_numpy(starts))
    scheduled = query_lens
    if verified is not None and verified.scheduled_lens is not None and not dummy:
        scheduled = np.array(verified.scheduled_lens, dtype=np.int32)
        np.cumsum(np.array(verified.host_lens(), dtype=np.int32), out=starts[1:m + 1])
    seq_lens = [r.seq_len for r in requests] + [0] * (num_reqs - m)
    buffers.seq_lens[:num_reqs].copy_(torch.tensor(seq_lens, dtype=torch.int32))
    slots = np.array([r.slot for r in requests] + [scratch_slot] * (num_reqs - m), dtype=np.intp)
    context = np.array([r.context_len for r in requests], dtype=np.int32)
    qsl = buffers.query_start_loc[:num_reqs + 1]
    return InputBatch(
        req_ids=[f"req-{i}" for i in range(m)], num_reqs=m, num_reqs_after_padding=num_reqs,
        idx_mapping=torch.from_numpy(slots).to(device, torch.int64), idx_mapping_np=slots,
        expanded_idx_mapping=torch.from_numpy(slots[:m]).to(device, torch.int64),
        expanded_local_pos=torch.zeros(m, dtype=torch.int32, device=device),
        num_scheduled_tokens=scheduled, num_tokens=n, num_tokens_after_padding=num_tokens,
        num_draft_tokens=0, num_draft_tokens_per_req=None,
        query_start_loc=qsl, query_start_loc_np=starts,
        seq_lens=buffers.seq_lens[:num_reqs],
        seq_lens_cpu_upper_bound=torch.tensor(seq_lens, dtype=torch.int32),
        dcp_local_seq_lens=None, num_computed_tokens_np=context,
        prefill_len_np=np.array([r.seq_len for r in requests], dtype=np.int32),
        num_computed_prefill_tokens_np=context,
        is_prefilling_np=query_lens > 1, has_prefill=bool((query_lens > 1).any()),
        decode_graph_eligible=not bool((query_lens > 1).any()),
        input_ids=buffers.input_ids[:num_tokens], positions=buffers.positions[:num_tokens],
        is_padding=buffers.is_padding[:num_tokens],
        logits_indices=qsl[1:m + 1] - 1,
        cu_num_logits=torch.arange(m + 1, dtype=torch.int32, device=device),
        cu_num_logits_np=np.arange(m + 1, dtype=np.int32), has_structured_output_reqs=False,
        prompt_lens=None)
