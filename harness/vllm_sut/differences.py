"""Every call into vLLM whose shape differs between the APIs the harness knows, in one place
(harness/vllm_code/api.py says how a tree's API is recognised; docs/vllm.md §9 lists the
differences). The rest of the adapters call these and never ask which API they face."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.history.decision import DpSyncState
from harness.vllm_code.release import Release


def graph_manager_args(api: Release, vllm_config: Any, decode_query_len: int,
                       draft_schedule: Sequence[tuple[int, int]] | None = None
                       ) -> dict[str, Any]:
    """The decode-shape arguments of CudaGraphManager / ModelCudaGraphManager.

    0.33 takes the one decode query length; 0.34 takes every uniform decode query length
    mapped to the most requests a batch of it has, as its model runner asks the config.
    Stand-in: a dynamic draft schedule is given as that map itself, since the config's
    expansion of it needs a speculative config with a drafter the harness does not build."""
    if api is Release.V0_33:
        return {"decode_query_len": decode_query_len}
    if draft_schedule is not None:
        return {"decode_query_lens": dict(draft_schedule)}
    return {"decode_query_lens": vllm_config.get_decode_cudagraph_query_lens(decode_query_len)}


def dispatch_candidates(api: Release, manager: Any, num_tokens: int,
                        uniform_token_count: int | None, num_ubatches: int) -> tuple:
    """The descriptors vLLM's dispatch tries, in order, for a batch.

    0.33 keys them by token count alone; 0.34 puts the smallest request-keyed decode graph
    of the batch's query length that holds ceil(tokens / q) requests first."""
    token_keyed = tuple(manager._candidates.get((num_tokens, 0), ()))
    if api is Release.V0_33 or uniform_token_count is None:
        return token_keyed
    table = manager._decode_descs.get((uniform_token_count, 0, num_ubatches), [])
    needed = -(-num_tokens // uniform_token_count)
    return ((table[needed],) if needed < len(table) else ()) + token_keyed


def sync_state_of(state: Any) -> DpSyncState:
    """vLLM's DPSyncState as the harness records it (0.34's agreed query-length bound is
    not kept: the descriptor the ranks dispatch to carries the bound it was chosen by)."""
    return DpSyncState(tuple(int(n) for n in state.num_tokens_across_dp.tolist()),
                       state.uniform_token_count, bool(state.eager), int(state.num_reqs),
                       bool(state.skip_drafts))


def vllm_sync_state(api: Release, dp_utils: Any, state: DpSyncState | None) -> Any:
    """The harness's record of the agreement as vLLM's DPSyncState, for UBatchRunner.prepare
    (which reads only the agreed uniform token count; the query-length bound is left unset)."""
    if state is None:
        return None
    import torch

    fields = {"num_tokens_across_dp": torch.tensor(state.num_tokens_across_dp,
                                                   dtype=torch.int32),
              "uniform_token_count": state.uniform_token_count, "eager": state.eager,
              "num_reqs": state.num_reqs, "skip_drafts": state.skip_drafts}
    if api is Release.V0_34:
        fields["max_query_len"] = None
    return dp_utils.DPSyncState(**fields)


def prepare_args(api: Release, desc: Any, dp_sync_state: Any) -> dict[str, Any]:
    """UBatchRunner.prepare's arguments after the slot mappings.

    0.33 takes the graph mode and splits on tokens; 0.34 takes the descriptor and the DP
    sync state, and splits a uniform multi-token batch on a request boundary."""
    if api is Release.V0_33:
        return {"cg_mode": desc.cg_mode}
    return {"batch_desc": desc, "dp_sync_state": dp_sync_state}
