"""The rank code: what one DP rank holds and does, the same in every world.

Startup captures every FULL graph (warmup first); each step then runs the DP sync, pads, and
either replays a captured graph, runs an eager microbatched step on the protocol threads, or
runs a plain eager step, and returns a StepRecord. Nothing here raises: every failure ends
up in the record, and every wait below is bounded.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import replace

import torch

from harness.batch import RankBatch, deciding_batch, dummy_query_lens
from harness.bug_switches import DummyExecution, DummyPadding, EagerSlices, IdleStep, VerifySlices
from harness.config import CudaGraphMode, HarnessConfig
from harness.faults import Fault, FaultKind, InjectedFault
from harness.history.decision import GraphDescriptor
from harness.history.records import GraphRecord, StartupRecord, StepRecord, rows_of, span
from harness.history.step_error import error_of
from harness.model.mini_moe import MiniMoE
from harness.model.state import RequestSpec, StateCache, initial_state
from harness.model.step_buffers import StepBuffers
from harness.runtime.comm import CollectiveLog, EagerAllToAll, LoggedAllToAll
from harness.runtime.device_fence import DeviceFence, DeviceWedged
from harness.runtime.graphs import make_graph_backend
from harness.runtime.schedule.descriptor import OS_SCHEDULE, Schedule
from harness.runtime.schedule.primitives import OS_PRIMITIVES
from harness.runtime.schedule.step import StepSchedule, recorded, scheduled_step
from harness.runtime.streams import CpuStreams, CudaStreams, make_streams
from harness.sut import systems
from harness.sut.graph_manager import GraphManager
from harness.sut.microbatch_runner import MicrobatchRunner
from harness.sut.staged_replay import staged_layout
from harness.sut.staging import scheduled_routes


def decide_under_rank_faults(runtime, batch, faults: Sequence[Fault]):
    """The rank's DP-sync decision, with the rank faults of the step: slow, skip, abort.
    `runtime` holds group, config, rank, collective_timeout_s and log (any execution's)."""
    kinds = {f.kind for f in faults}
    if FaultKind.SLOW_RANK in kinds:
        time.sleep(max(f.seconds for f in faults if f.kind is FaultKind.SLOW_RANK))
    if FaultKind.SKIP_SYNC in kinds:
        raise InjectedFault(f"rank {runtime.rank} skipped the DP sync")
    plan = systems.decide(runtime.group, runtime.config, runtime.rank, batch,
                          runtime.collective_timeout_s, runtime.log)
    if FaultKind.ABORT_RANK in kinds:
        os.abort()  # the process ends here; its peers wait in the all-to-all
    return plan


def settled(fence: DeviceFence | None, what: str, error):
    """The step's error once its device work is waited for, bounded: its own error first,
    else the device's being wedged (no fence: a CPU rank, nothing to wait for)."""
    if fence is None:
        return error
    try:
        fence.wait(what)
    except DeviceWedged as exc:
        return error or error_of(exc)
    return error


class RankRuntime:
    def __init__(self, config: HarnessConfig, rank: int, group, *, device: str = "cpu",
                 collective_timeout_s: float = 5.0, hang_timeout_s: float = 5.0,
                 trace_path: str | None = None, warm_cublas: bool = True,
                 emulated_graphs: bool = False) -> None:
        """`group` carries the DP sync (CPU tensors) and the expert all-to-alls (tensors on
        `device`): on CUDA, a group with a CPU backend and a CUDA one. Everything the rank
        allocates lives on `device`. `warm_cublas=False` only exists to show the capture
        hazard it prevents. `emulated_graphs` keeps logical streams and emulated graphs on
        any device (for collectives that cannot be captured, such as gloo's on CUDA)."""
        self.config = config
        self.rank = rank
        self.group = group
        self.collective_timeout_s = collective_timeout_s
        self.streams = CpuStreams(device) if emulated_graphs else make_streams(device)
        self.device = self.streams.device
        self.log = CollectiveLog(trace_path)
        self.model = MiniMoE(config, rank, LoggedAllToAll(
            EagerAllToAll(group, collective_timeout_s, host_synced=emulated_graphs),
            self.log), device=self.device)
        self.cache = StateCache(config.serving.max_num_reqs, config.model.hidden_size, self.device)
        self._initial_state = initial_state(config, rank)  # drawn once: every scenario's start
        self.cache.state.copy_(self._initial_state)
        self.runner = MicrobatchRunner(config, self.streams, hang_timeout_s,
                                       warm_cublas=warm_cublas)
        # A controlled run's parked threads wait out the longest collective the running one
        # makes (docs/schedules.md: safety bound).
        self.schedule_safety_s = collective_timeout_s + hang_timeout_s
        self._choices: tuple[int, ...] | None = None  # the last microbatch run's, if controlled
        self.table = systems.graph_table(config, rank)
        backend = make_graph_backend(self.streams, collective_timeout_s)
        self.manager = GraphManager(config, self.table, self.streams, backend, self.runner,
                                    self.model, self.cache, self.log)
        # On CUDA, results are read only once the device work is known to be done.
        self.fence = (DeviceFence(self.streams.all_raw, collective_timeout_s)
                      if isinstance(self.streams, CudaStreams) else None)

    def reset_state(self) -> None:
        """Back to the initial per-request state, for the next scenario on the same graphs."""
        if self.fence is not None and self.fence.wedged is not None:
            # The host copy would wait behind the stuck collective forever (measured on the
            # H100); no step runs after a start-up that wedged the device.
            return
        self.cache.state.copy_(self._initial_state)

    @property
    def has_pending_run(self) -> bool:
        return self.runner.has_pending_run

    def alive_threads(self) -> tuple[str, ...]:
        return tuple(self.runner.alive_threads())

    def startup(self) -> StartupRecord:
        start = time.monotonic()
        error = None
        try:
            self.manager.capture_all()
        except BaseException as exc:  # reported in the record
            error = error_of(exc)
        # A capture whose collective found no peer (ranks that planned different graphs)
        # holds the device: said here within a collective bound, not by the driver's deadline.
        error = settled(self.fence, f"rank {self.rank} start-up", error)
        planned = tuple(d.label() for d in self.table.capture_order()
                        if d.cg_mode is CudaGraphMode.FULL)
        return StartupRecord(self.rank, planned, self._graph_records(), error,
                             self.alive_threads(), self.has_pending_run,
                             time.monotonic() - start)

    def _graph_records(self) -> tuple[GraphRecord, ...]:
        records = []
        for key, captured in self.manager.captured.items():
            desc = captured.desc
            # A graph that is not split is reached by any batch of its size whose ranks do
            # not all allow microbatching; a twin needs the DP sync to choose it.
            reached = (self.table.reaching_batch_size(desc) if desc.microbatched
                       else desc.num_tokens)
            records.append(GraphRecord(desc.label(), desc.num_ubatches, captured.empty,
                                       captured.fingerprint, self.manager.graph_bytes(key),
                                       reached))
        return tuple(records)

    def _slicing_lens(self, batch: RankBatch, plan) -> tuple[int, ...]:
        """What the split counts requests by (the buffers hold every request)."""
        if batch.dead:  # the silent member's padding, laid out as its peers' (dead_ranks.py)
            return dummy_query_lens(plan.num_reqs, plan.num_tokens)
        # vLLM 0.34.0 cuts requests by the untrimmed counts under adaptive verification (§7.24).
        if self.config.mutation.verify_slices is VerifySlices.UPPER_BOUND:
            return batch.slicing_lens()
        return batch.request_query_lens()

    def step(self, index: int, requests: Sequence[RequestSpec], batch: RankBatch,
             faults: Sequence[Fault] = (), schedule: Schedule = OS_SCHEDULE) -> StepRecord:
        start = time.monotonic()
        self._choices = None
        mark = self.log.mark()
        plan, executed, captured_split, replay_split, fingerprint = None, "failed", (), (), ()
        replayed = None  # the descriptor of the graph whose replay ran
        staged = None  # the plan of a replay that staged its real tokens (docs/spec.md §3.4)
        ran: tuple = ()  # the split the model actually ran (whose comm buffers hold the routes)
        outputs, error = torch.zeros(0), None
        self.log.note(f"step {index}")
        try:
            if self.fence is not None:
                self.fence.check()  # a device held by a stuck collective takes no new work
            if self._returns_early(batch):
                return self._skipped(index, start)
            self.model.set_run_tag(index + 1)  # capture ran under tag 0
            plan = decide_under_rank_faults(self, batch, faults)
            plan_ran = self._dummy_eager(self._dummy_unpadded(plan, batch), batch)
            desc, lens = plan_ran.desc, self._slicing_lens(batch, plan_ran)
            captured = (self.manager.lookup(desc) if desc.cg_mode is CudaGraphMode.FULL
                        else None)
            if captured is not None:
                replayed = captured.desc.label()
                layout = staged_layout(plan_ran)
                replay_split = self.manager.replay(desc, requests, lens, layout)
                staged = plan_ran if layout is not None else None
                captured_split = ran = captured.split
                fingerprint = self.log.since(mark) + captured.fingerprint
                outputs = captured.buffers.output[:batch.num_tokens]
                executed = "replay"
            else:
                buffers = self._eager_buffers(plan_ran.num_tokens, self._eager_reqs(plan_ran),
                                              requests)
                ran = self._run_eager(desc, buffers, lens or (1,), faults, plan_ran.state,
                                      schedule)
                fingerprint = self.log.since(mark)
                outputs = buffers.output[:batch.num_tokens]
                executed = "eager-microbatched" if desc.microbatched else "eager"
        except BaseException as exc:  # reported in the record
            error = error_of(recorded(exc))
            fingerprint = self.log.since(mark)
        error = settled(self.fence, f"rank {self.rank} step {index}", error)
        wedged = self.fence is not None and self.fence.wedged is not None
        return StepRecord(
            rank=self.rank, step=index, plan=plan, executed=executed,
            captured_split=tuple(span(s) for s in captured_split),
            replay_split=tuple(span(s) for s in replay_split),
            fingerprint=fingerprint, routes=self._received_routes(ran, error is None,
                                                                 staged),
            replayed=replayed, ran_split=tuple(span(s) for s in ran),
            a2a_tokens_per_rank=self.model.capacity // self.config.model.top_k,
            run_tag=index + 1, received_tags=self._received_tags(ran, error is None),
            # A wedged device would block any read; its rows are left out.
            outputs=() if wedged else rows_of(outputs),
            state=() if wedged else rows_of(self.cache.state),
            threads_alive=self.alive_threads(), pending_run=self.has_pending_run, error=error,
            injected_fault=bool(faults), seconds=time.monotonic() - start,
            schedule_choices=self._choices)

    def _run_eager(self, desc, buffers, lens, faults, state, schedule: Schedule):
        """An eager step; a microbatched one on threads `schedule` interleaves (unsplit steps
        start no thread: nothing to schedule)."""
        step: StepSchedule | None = None
        try:
            with scheduled_step(schedule if desc.microbatched else OS_SCHEDULE,
                                self.schedule_safety_s, f"rank {self.rank}") as step:
                self.runner.threads.primitives = step.primitives
                return self.manager.run_eager(desc, buffers, lens, faults, state)
        finally:
            self.runner.threads.primitives = OS_PRIMITIVES
            self._choices = step.choices if step is not None else None

    def _received_routes(self, split, completed: bool,
                         staged=None) -> tuple[tuple[int, int, int], ...]:
        """Routes as (source, scheduled token index, expert); a staged replay's rows are
        turned back into scheduled order with every source's layout."""
        if not completed:
            return ()
        routes = tuple(sorted(route for i, sl in enumerate(split)
                              for route in self.model.received_routes(i, sl.num_tokens)))
        return routes if staged is None else scheduled_routes(routes, staged)

    def _received_tags(self, split, completed: bool) -> tuple[tuple[int, int, int], ...]:
        if not completed:
            return ()
        return tuple(tag for i, sl in enumerate(split)
                     for tag in self.model.received_tags(i, sl.num_tokens))

    def _dummy_unpadded(self, plan, batch):
        """What the rank runs: its plan, or with dummy_padding unpadded (vLLM issue #26137) an
        idle rank's dummy batch at its own size, dispatched by its own tokens."""
        if self.config.mutation.dummy_padding is not DummyPadding.UNPADDED or batch.num_tokens:
            return plan
        dummy = deciding_batch(batch, self.config.serving.decode_query_len)
        desc = self.table.dispatch(dummy.num_reqs, dummy.num_tokens, dummy.uniform_token_count,
                                   dummy.max_query_len)
        if desc.cg_mode is not CudaGraphMode.FULL or self.manager.lookup(desc) is None:
            desc = GraphDescriptor(CudaGraphMode.NONE, dummy.num_tokens, dummy.num_reqs)
        return replace(plan, desc=desc, num_tokens=desc.num_tokens,
                       num_reqs=desc.num_reqs or dummy.num_reqs, regions=())

    def _returns_early(self, batch: RankBatch) -> bool:
        """idle_step skip (vLLM #43547): a rank with no token leaves the step before the DP
        sync and the dummy forward its peers' collectives need."""
        return (self.config.mutation.idle_step is IdleStep.SKIP and not batch.num_tokens
                and self.config.serving.dp_size > 1)

    def _skipped(self, index: int, start: float) -> StepRecord:
        """The record of a step the rank left at once: no plan, no collective, no row."""
        return StepRecord(
            rank=self.rank, step=index, plan=None, executed="skipped", captured_split=(),
            replay_split=(), fingerprint=(), routes=(), outputs=(),
            state=rows_of(self.cache.state), threads_alive=self.alive_threads(),
            pending_run=self.has_pending_run, error=None, injected_fault=False,
            seconds=time.monotonic() - start)

    def _dummy_eager(self, plan, batch):
        """What an idle rank runs: its plan, or with dummy_execution eager (ROCm/ATOM #1697)
        the dummy eagerly and unsplit where its peers replay a graph."""
        if (self.config.mutation.dummy_execution is not DummyExecution.EAGER or batch.num_tokens
                or plan.desc.cg_mode is not CudaGraphMode.FULL):
            return plan
        desc = GraphDescriptor(CudaGraphMode.NONE, plan.num_tokens, plan.num_reqs)
        return replace(plan, desc=desc, regions=())

    def _eager_reqs(self, plan) -> int:
        """Requests an eager step pads to: the plan's (a NONE descriptor pads none), or with
        eager_slices graph-padded (vLLM PR #29933) the synced count, as a graph would."""
        if (self.config.mutation.eager_slices is EagerSlices.GRAPH_PADDED and plan.desc.microbatched
                and plan.state is not None):
            return max(plan.num_reqs, plan.state.num_reqs)
        return plan.num_reqs

    def _eager_buffers(self, num_tokens: int, num_reqs: int,
                       requests: Sequence[RequestSpec]) -> StepBuffers:
        # An idle rank still joins the expert all-to-alls, with one padding token.
        buffers = StepBuffers(max(num_tokens, 1), max(num_reqs, 1), self.config.model.hidden_size,
                              self.cache.scratch_slot, self.device)
        if requests:
            buffers.fill(requests)
        else:
            buffers.fill([RequestSpec(self.cache.scratch_slot, 0, (0,))])
            buffers.is_padding.fill_(True)
        return buffers
