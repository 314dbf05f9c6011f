"""vLLM's DP sync (dispatch_cg_and_sync_dp -> sync_cudagraph_and_dp_padding) on a harness group.

vLLM finds its DP group through the module global `get_dp_group` of dp_utils. For the call,
that name is routed per thread: a thread inside `vllm_sync` gets a stand-in over the harness
rank's gloo group, every other thread gets vLLM's own function. The routing is installed by
the first caller in and removed by the last one out, so nothing stays patched after a call
and the harness's thread ranks (several calls at once, one group each) never share a group.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from vllm.distributed.utils import cpu_all_reduce_

from harness.batch import RankBatch, deciding_batch
from harness.config import HarnessConfig
from harness.runtime.comm import CollectiveLog, CollectiveTimeout
from harness.sut.dp_sync import SyncDecision
from harness.vllm_sut.candidates import to_harness, vllm_graph_manager
from harness.vllm_sut.code import vllm_code
from harness.vllm_sut.configs import vllm_configs
from harness.vllm_sut.differences import sync_state_of


@dataclass(frozen=True)
class DpGroupStandIn:
    """The part of vLLM's GroupCoordinator the DP sync uses, over a harness gloo group."""

    cpu_group: Any
    cpu_timeout: timedelta
    log: CollectiveLog | None = None
    # 0.34's fault tolerance drops these columns before agreeing: the ones this rank was told
    # of (vLLM's sentinel sets them on GroupCoordinator.dead_dp_ranks, docs/spec.md §1.7).
    dead_dp_ranks: frozenset[int] = frozenset()
    # A dead rank, kept in the world's rings as a silent member: it contributes zeros, as its
    # slot reads in the group vLLM rebuilds over the survivors.
    silent: bool = False

    def cpu_all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        # vLLM's own low-latency CPU all-reduce (gloo send/recv), bounded by the timeout.
        if self.silent:
            tensor.zero_()
        if self.log is not None:
            self.log.add_tensor("all_reduce", tensor)
        try:
            return cpu_all_reduce_(tensor, self.cpu_group, self.cpu_timeout)
        except RuntimeError as exc:
            what = f"vLLM's DP all-reduce of {tuple(tensor.shape)}"
            raise CollectiveTimeout(f"{what} did not complete: "
                                    f"{str(exc).splitlines()[0]}") from exc


class _PerThreadDpGroup:
    """Routes one dp_utils module's get_dp_group to the calling thread's stand-in while any
    call runs (one router per module: a patched vLLM's dp_utils is a module of its own)."""

    def __init__(self, dp_utils) -> None:
        self._dp_utils = dp_utils
        self._lock = threading.Lock()
        self._local = threading.local()
        self._callers = 0
        self._original = None

    def _routed(self):
        stand_in = getattr(self._local, "group", None)
        return stand_in if stand_in is not None else self._original()

    def __call__(self, stand_in: DpGroupStandIn) -> _PerThreadDpGroup:
        self._local.group = stand_in
        return self

    def __enter__(self) -> None:
        with self._lock:
            if self._callers == 0:
                self._original = self._dp_utils.get_dp_group
                self._dp_utils.get_dp_group = self._routed
            self._callers += 1

    def __exit__(self, *exc_info) -> None:
        self._local.group = None
        with self._lock:
            self._callers -= 1
            if self._callers == 0:
                self._dp_utils.get_dp_group = self._original
                self._original = None


_ROUTERS: dict[int, _PerThreadDpGroup] = {}
_ROUTERS_LOCK = threading.Lock()


def dp_group_of_this_thread(dp_utils) -> _PerThreadDpGroup:
    with _ROUTERS_LOCK:
        router = _ROUTERS.get(id(dp_utils))
        if router is None:
            router = _ROUTERS[id(dp_utils)] = _PerThreadDpGroup(dp_utils)
        return router


def vllm_check_ubatch_thresholds(config: HarnessConfig, num_tokens: int,
                                 uniform_decode: bool) -> bool:
    """vLLM's check_ubatch_thresholds on the translated ParallelConfig."""
    return vllm_code(config).ubatch_utils.check_ubatch_thresholds(
        vllm_configs(config).parallel_config, num_tokens, uniform_decode=uniform_decode)


def vllm_sync(group, config: HarnessConfig, rank: int, batch: RankBatch,
              timeout_s: float, log: CollectiveLog | None = None) -> SyncDecision:
    """This rank's DP sync exactly as vLLM's runner calls it, as the harness's SyncDecision."""
    stand_in = DpGroupStandIn(group, timedelta(seconds=timeout_s), log,
                              frozenset(batch.knows_dead), batch.dead)
    return sync_with(stand_in, config, rank, batch)


def sync_with(stand_in, config: HarnessConfig, rank: int, batch: RankBatch) -> SyncDecision:
    """vLLM's dispatch_cg_and_sync_dp for this rank, its all-reduce done by `stand_in`; an
    idle rank syncs its dummy batch, as vLLM's execute_dummy_batch does."""
    batch = deciding_batch(batch, config.serving.decode_query_len)
    configs = vllm_configs(config)
    manager = vllm_graph_manager(config)
    dp_utils = vllm_code(config).dp_utils
    uct = batch.uniform_token_count
    with dp_group_of_this_thread(dp_utils)(stand_in):
        desc, state = dp_utils.dispatch_cg_and_sync_dp(
            manager, batch.num_reqs, batch.num_tokens, uct, config.serving.dp_size, rank,
            max_query_len=batch.max_query_len,
            parallel_config=configs.parallel_config,
            # The runner allows microbatching iff it has a UBatchRunner (not a profile run).
            allow_ubatching=batch.allow_ubatching and manager.ubatch_runner is not None,
            uniform_decode=uct == config.serving.decode_query_len,
            allow_skip_drafts=batch.allow_skip_drafts,
        )
    return SyncDecision(to_harness(desc), None if state is None else sync_state_of(state))
