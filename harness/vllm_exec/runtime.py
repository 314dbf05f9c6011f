"""A DP rank whose step runs on vLLM's own execution code (docs/spec.md §10).

The decision is the configured system's (the harness's or vLLM's, `harness.sut.systems`);
what executes it is vLLM's: `UBatchRunner.prepare` / `begin_capturable_run` / `finish` /
`abort_pending_run`, the `UBatchContext` handoffs of `vllm/v1/worker/ubatching.py`, and
`ModelCudaGraphManager.capture` / `run_fullgraph`, over the miniature MoE. The rank returns
the same records as the harness's own runtime, plus what vLLM's threads did
(`VllmExecTrace`). vLLM's own waits are unbounded: a step that never returns is ended by
the world's deadline, with every thread's stack.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from vllm import forward_context
from vllm.config.compilation import CUDAGraphMode as VllmMode
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
from vllm.v1.worker.gpu.input_batch import InputBuffers

from harness.batch import RankBatch
from harness.config import CudaGraphMode, HarnessConfig
from harness.faults import Fault, FaultKind, InjectedFault
from harness.history.decision import GraphDescriptor
from harness.history.records import (
    GraphRecord,
    StartupRecord,
    StepRecord,
    VllmExecTrace,
    rows_of,
)
from harness.history.step_error import error_of
from harness.model.state import RequestSpec, StateCache, initial_state
from harness.runtime.comm import CollectiveLog, EagerAllToAll, LoggedAllToAll
from harness.runtime.device_fence import DeviceFence
from harness.runtime.schedule.descriptor import OS_SCHEDULE, Schedule
from harness.runtime.schedule.step import recorded
from harness.sut import systems
from harness.sut.rank_runtime import decide_under_rank_faults, settled
from harness.vllm_exec.ids_gather import BoundedAllGather
from harness.vllm_exec.inputs import (
    ATTN_GROUPS,
    KV_CACHE_CONFIG,
    DummyBlockTables,
    MiniModelState,
    step_input_batch,
    whole_step_attn,
)
from harness.vllm_exec.model import MiniModel, VllmStyleMoE
from harness.vllm_exec.scheduling import VllmScheduling
from harness.vllm_exec.stand_ins import CudaStandIns, stand_ins_for
from harness.vllm_sut.candidates import to_harness
from harness.vllm_sut.code import check_same_release, vllm_code
from harness.vllm_sut.configs import vllm_configs
from harness.vllm_sut.differences import graph_manager_args, prepare_args, vllm_sync_state

Span = tuple[int, int, int, int]


def _span(s) -> Span:
    return (s.request_slice.start, s.request_slice.stop, s.token_slice.start, s.token_slice.stop)


def to_vllm(desc: GraphDescriptor) -> BatchExecutionDescriptor:
    return BatchExecutionDescriptor(VllmMode[desc.cg_mode.name], desc.num_tokens, desc.num_reqs,
                                    desc.uniform_token_count, desc.max_query_len,
                                    num_ubatches=desc.num_ubatches)


class VllmExecRuntime:
    """One rank: vLLM's runner and graph manager over the miniature, on a CPU rank's
    stand-ins or on a CUDA rank's own streams and graphs (harness/vllm_exec/stand_ins.py)."""

    # vLLM's microbatch waits have no bound: the worker's step watch names an overdue step.
    waits_unbounded = True

    def __init__(self, config: HarnessConfig, rank: int, group, *, device: str = "cpu",
                 collective_timeout_s: float = 5.0, hang_timeout_s: float = 5.0,
                 trace_path: str | None = None, **unused: object) -> None:
        self.config = config
        self.rank = rank
        self.group = group
        self.collective_timeout_s = collective_timeout_s
        check_same_release(config)
        self.code = vllm_code(config)
        self.device = _resolved(device)
        self.stand_ins = stand_ins_for(self.device, collective_timeout_s)
        self.stand_ins.install(self.code.ubatching, self.code.runner_module,
                               self.code.cudagraph_utils)
        self.log = CollectiveLog(trace_path)
        self.moe = VllmStyleMoE(config, rank, LoggedAllToAll(
            EagerAllToAll(group, collective_timeout_s), self.log), self.code.ubatching,
            device=self.device, stream_log=self.stand_ins.stream_log,
            all_gather=BoundedAllGather(group, collective_timeout_s, self.log))
        self.cache = StateCache(config.serving.max_num_reqs, config.model.hidden_size, self.device)
        self.cache.state.copy_(initial_state(config, rank))
        self.model = MiniModel(self.moe, self.cache, forward_context)
        self.table = systems.graph_table(config, rank)
        self.vllm_config = _for_rank(vllm_configs(config), rank)
        self.model_state = MiniModelState(config.serving.max_num_reqs, config.num_ubatches,
                                          self.cache.scratch_slot, self.device)
        self.buffers = InputBuffers(config.serving.max_num_reqs,
                                    config.serving.max_num_batched_tokens, self.device)
        self.block_tables = DummyBlockTables(config.serving.max_num_reqs,
                                             config.serving.max_num_batched_tokens, self.device)
        self.runner = self._build_runner()
        self.scheduling = VllmScheduling(self.code.ubatching, self.code.runner_module,
                                         self.runner, collective_timeout_s + hang_timeout_s, rank)
        self.manager = self._build_manager()
        # On CUDA, results are read only once the device work is known to be done: a peer
        # that left the step keeps this rank's NCCL kernels, and any read behind them, waiting.
        self.fence = (DeviceFence(self.stand_ins.all_streams, collective_timeout_s)
                      if isinstance(self.stand_ins, CudaStandIns) else None)
        self._last_split: tuple[Span, ...] = ()
        self.captured_splits: dict[int, tuple[Span, ...]] = {}  # id(graph) -> split
        self.graph_fingerprints: dict[int, tuple] = {}

    def _build_runner(self):
        parallel = self.vllm_config.parallel_config
        if not (parallel.use_ubatching and parallel.data_parallel_size > 1):
            return None  # as vLLM's maybe_build_ubatch_runner decides
        runner = self.code.runner_module.UBatchRunner(
            self.vllm_config, self.device, self.model_state, ATTN_GROUPS,
            KV_CACHE_CONFIG, self.config.serving.max_num_reqs)
        prepare = runner.prepare

        def prepare_and_note(*args, **kwargs):
            state = prepare(*args, **kwargs)
            self._last_split = tuple(_span(s) for s in state.slices)
            return state

        runner.prepare = prepare_and_note  # the split a capture freezes is noted per graph
        return runner

    def _build_manager(self):
        """vLLM's graph manager, capturing what the deciding system's graph table holds
        (vLLM's own candidates under sut vllm): its FULL graphs, as the harness's own
        execution does (PIECEWISE graphs need a compiled model; those steps run eagerly)."""
        full = [to_vllm(d) for d in self.table.capture_order()
                if d.cg_mode is CudaGraphMode.FULL]
        mode = VllmMode.FULL if full else VllmMode.NONE
        manager = self.code.cudagraph_utils.ModelCudaGraphManager(
            self.vllm_config, self.device, mode,
            **graph_manager_args(self.code.api, self.vllm_config,
                                 self.config.serving.decode_query_len,
                                 self.config.serving.draft_schedule),
            varlen_decode=self.config.serving.varlen_decode, ubatch_runner=self.runner)
        manager._capture_descs = {VllmMode.FULL: full} if full else {}
        return manager

    def reset_state(self) -> None:
        self.cache.state.copy_(initial_state(self.config, self.rank))

    # -- start-up --------------------------------------------------------------------------

    @contextlib.contextmanager
    def _observe_capture(self, graph) -> Iterator[None]:
        # The split is the one prepared just before: vLLM prepares outside the graph.
        mark = self.log.mark()
        yield
        self.graph_fingerprints[id(graph)] = self.log.since(mark)
        self.captured_splits[id(graph)] = self._last_split

    def startup(self) -> StartupRecord:
        start = time.monotonic()
        error = None
        self.stand_ins.capture_observer = self._observe_capture
        try:
            if self.manager.needs_capture():
                self.manager.capture(self.model, self.model_state, self.buffers, None,
                                     self.block_tables, ATTN_GROUPS, KV_CACHE_CONFIG)
        except BaseException as exc:  # reported in the record
            error = error_of(exc)
        finally:
            self.stand_ins.capture_observer = contextlib.nullcontext
            if isinstance(self.stand_ins, CudaStandIns):
                self.stand_ins.join_streams()
        planned = tuple(d.label() for d in self.table.capture_order()
                        if d.cg_mode is CudaGraphMode.FULL)
        return StartupRecord(self.rank, planned, self._graph_records(), error,
                             self.alive_threads(), self.has_pending_run,
                             time.monotonic() - start)

    def _graph_records(self) -> tuple[GraphRecord, ...]:
        records = []
        for vdesc, graph in self.manager.graphs.items():
            desc = to_harness(vdesc)
            reached = (self.table.reaching_batch_size(desc) if desc.microbatched
                       else desc.num_tokens)
            records.append(GraphRecord(desc.label(), desc.num_ubatches,
                                       self.stand_ins.is_empty(graph),
                                       self.graph_fingerprints.get(id(graph), ()), 0, reached))
        return tuple(records)

    @property
    def has_pending_run(self) -> bool:
        return self.runner is not None and self.runner._pending_finish is not None

    @staticmethod
    def alive_threads() -> tuple[str, ...]:
        # vLLM's microbatch threads are unnamed; their names carry their target.
        return tuple(t.name for t in threading.enumerate()
                     if "run_ubatch" in t.name and t.is_alive())

    # -- a step ----------------------------------------------------------------------------

    def step(self, index: int, requests: Sequence[RequestSpec], batch: RankBatch,
             faults: Sequence[Fault] = (), schedule: Schedule = OS_SCHEDULE) -> StepRecord:
        start = time.monotonic()
        mark, events = self.log.mark(), len(self.stand_ins.event_log)
        order = self.stand_ins.stream_log.mark()
        trace = self.moe.arm(faults)
        self.stand_ins.thread_setup.arm(_setup_fault(faults))
        plan, ran, error, scheduled = None, None, None, None
        self.log.note(f"step {index}")
        try:
            if self.fence is not None:
                self.fence.check()  # a device held by a stuck collective takes no new work
            plan = decide_under_rank_faults(self, batch, faults)
            # As vLLM's worker runs execute_model; its threads interleaved by `schedule`.
            with torch.inference_mode(), self.scheduling.step(schedule) as scheduled:
                ran = self._execute(silent_member_view(plan, batch), requests,
                                    batch.num_tokens, batch)
        except BaseException as exc:  # reported in the record
            error = error_of(recorded(exc))
        finally:
            self.stand_ins.thread_setup.arm(None)
        error = settled(self.fence, f"rank {self.rank} step {index}", error)
        readable = self.fence is None or self.fence.wedged is None
        fingerprint = self.log.since(mark) + (ran.graph_fingerprint if ran else ())
        exec_trace = VllmExecTrace(tuple(trace.errors), tuple(trace.recv), self._leftovers(),
                                   tuple(self.stand_ins.event_log[events:]),
                                   self.stand_ins.stream_log.since(order))
        return StepRecord(
            rank=self.rank, step=index, plan=plan,
            executed=ran.executed if ran else "failed",
            captured_split=ran.captured_split if ran else (),
            replay_split=ran.replay_split if ran else (),
            fingerprint=fingerprint, routes=self._routes(ran) if ran and readable else (),
            replayed=ran.replayed if ran else None, ran_split=ran.split if ran else (),
            a2a_tokens_per_rank=self.moe.capacity // self.config.model.top_k,
            # A wedged device would block any read; its rows are left out.
            outputs=rows_of(ran.outputs) if ran and readable else (),
            state=rows_of(self.cache.state) if readable else (),
            threads_alive=self.alive_threads(), pending_run=self.has_pending_run,
            error=error, injected_fault=bool(faults), seconds=time.monotonic() - start,
            vllm_exec=exec_trace, schedule_choices=scheduled and scheduled.choices)

    def execute(self, desc: GraphDescriptor, requests: Sequence[RequestSpec]) -> torch.Tensor:
        """`desc` run over `requests` as a step runs it once the DP sync has chosen it, with
        no sync and no record (what the GPU bench times); the real tokens' rows."""
        chosen = _Chosen(desc, desc.num_tokens, desc.num_reqs)
        return self._execute(chosen, requests, sum(r.query_len for r in requests)).outputs

    def _execute(self, plan, requests: Sequence[RequestSpec], real_tokens: int,
                 verified: RankBatch | None = None) -> _Ran:
        desc = plan.desc
        vdesc = to_vllm(desc)
        graph = (self.manager.graphs.get(vdesc) if desc.cg_mode is CudaGraphMode.FULL
                 else None)
        num_tokens = max(plan.num_tokens, real_tokens, 1)
        num_reqs = max(plan.num_reqs or 0, len(requests), 1)
        if graph is not None:
            num_tokens, num_reqs = vdesc.num_tokens, vdesc.num_reqs or num_reqs
        batch = step_input_batch(self.buffers, requests, num_tokens, num_reqs,
                                 self.cache.scratch_slot, self.device, verified)
        whole = ((0, num_reqs, 0, num_tokens),)
        if graph is not None:
            return self._replay(vdesc, graph, batch, real_tokens, whole)
        inputs = {"input_ids": batch.input_ids, "positions": batch.positions,
                  "inputs_embeds": None, "intermediate_tensors": None}
        if desc.num_ubatches > 1:
            synced = vllm_sync_state(self.code.api, self.code.dp_utils, plan.state)
            state = self.runner.prepare(batch, *self._dummy_tables(num_reqs, num_tokens),
                                        **prepare_args(self.code.api, vdesc, synced))
            hidden = self.runner.run(self.model, inputs, state)
            split = tuple(_span(s) for s in state.slices)
            return _Ran("eager-microbatched", split, (), (), None, hidden[:real_tokens], ())
        attn = whole_step_attn(self.model_state, batch)
        with forward_context.set_forward_context(
                attn, self.vllm_config, num_tokens=num_tokens,
                num_tokens_across_dp=plan.state and _across_dp(plan.state),
                is_padding=batch.is_padding):
            hidden = self.model(**inputs)
        return _Ran("eager", whole, (), (), None, hidden[:real_tokens], ())

    def _replay(self, vdesc, graph, batch, real_tokens: int, whole) -> _Ran:
        if vdesc.num_ubatches > 1:
            state = self.runner.prepare(batch, *self._dummy_tables(vdesc.num_reqs,
                                                                   vdesc.num_tokens),
                                        **prepare_args(self.code.api, vdesc, None))
            replay_split = tuple(_span(s) for s in state.slices)
            captured = self.captured_splits.get(id(graph), ())
        else:
            whole_step_attn(self.model_state, batch)
            replay_split = captured = whole
        hidden = self.manager.run_fullgraph(vdesc)
        for i, s in enumerate(captured):  # the replay's routes are in the captured buffers
            self.moe.reserve(i, s[3] - s[2])
        label = to_harness(vdesc).label()
        return _Ran("replay", captured, captured, replay_split, label, hidden[:real_tokens],
                    self.graph_fingerprints.get(id(graph), ()))

    def _dummy_tables(self, num_reqs: int, num_tokens: int):
        return (self.block_tables.get_dummy_block_tables(num_reqs),
                self.block_tables.get_dummy_slot_mappings(num_tokens))

    def _routes(self, ran: _Ran) -> tuple[tuple[int, int, int], ...]:
        if ran is None:
            return ()
        return tuple(sorted(route for i, s in enumerate(ran.split)
                            for route in self.moe.received_routes(i, s[3] - s[2])))

    def _leftovers(self) -> tuple[str, ...]:
        """vLLM's process-global ubatching state and forward context left set by the step."""
        u = self.code.ubatching
        left = [f"_CURRENT_CONTEXTS[{i}] is set" for i, c in enumerate(u._CURRENT_CONTEXTS)
                if c is not None]
        if u._THREAD_ID_TO_CONTEXT:
            left.append(f"_THREAD_ID_TO_CONTEXT holds {len(u._THREAD_ID_TO_CONTEXT)} thread(s)")
        if forward_context._forward_context is not None:
            left.append("the forward context is set")
        return tuple(left)


@dataclass(frozen=True)
class _Chosen:
    """What `_execute` reads of a step plan."""

    desc: GraphDescriptor
    num_tokens: int
    num_reqs: int | None
    state: object = None  # no DP sync ran: vLLM's forward context gets no token counts


@dataclass(frozen=True)
class _Ran:
    """How a step executed: its kind, the split the model ran, what a replay compared."""

    executed: str
    split: tuple[Span, ...]
    captured_split: tuple[Span, ...]
    replay_split: tuple[Span, ...]
    replayed: str | None
    outputs: torch.Tensor
    graph_fingerprint: tuple


def _resolved(device: str) -> torch.device:
    """The rank's device, with its index (vLLM's threads select it by index)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _for_rank(configs, rank: int):
    """vLLM's configs as rank `rank` holds them (DPMetadata reads its own row by it)."""
    parallel = copy.deepcopy(configs.parallel_config)
    parallel.data_parallel_rank = rank
    return dataclasses.replace(configs, parallel_config=parallel)


def silent_member_view(plan, batch: RankBatch):
    """The plan a dead rank's silent member runs (harness/dead_ranks.py): where nothing was
    padded its own slot reads 0 to the live ranks, while it runs its dummy batch, which
    vLLM's forward context checks against that slot; it reads what the member runs."""
    state = plan.state
    if not batch.dead or state is None or state.num_tokens_across_dp[plan.rank] == \
            plan.num_tokens:
        return plan
    across = list(state.num_tokens_across_dp)
    across[plan.rank] = plan.num_tokens
    return dataclasses.replace(plan, state=dataclasses.replace(
        state, num_tokens_across_dp=tuple(across)))


def _across_dp(state) -> torch.Tensor:
    return torch.tensor(state.num_tokens_across_dp, dtype=torch.int32)


def _setup_fault(faults: Sequence[Fault]):
    """Raises in the set-up of the n-th microbatch thread to reach it, when a fault says so."""
    targets = {f.ubatch for f in faults if f.kind is FaultKind.RAISE_IN_SETUP}
    if not targets:
        return None

    def hook(order: int) -> None:
        if order in targets:
            raise InjectedFault(f"injected failure in microbatch thread {order}'s device "
                                "set-up, before its context")

    return hook
