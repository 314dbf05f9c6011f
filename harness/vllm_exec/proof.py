"""vLLM's own microbatch handoffs under every schedule of one step (docs/schedules.md, "The
exhaustive proof over vLLM's ubatching").

One rank's step, in this process: vLLM's `UBatchRunner.begin_capturable_run` and `finish`
(vllm/v1/worker/gpu/ubatch_utils.py) start k threads in `UBatchContext`s
(vllm/v1/worker/ubatching.py), as patched by the chosen `--vllm-patch` files, routed through
`explore`'s scheduler by harness/vllm_exec/scheduling.py. Each thread runs the MoE layer's
handoffs as the miniature drives them (per exchange, dispatch then combine: run the receive
left for me, register mine, yield, read it) with one fault stage in one microbatch, and
no collective (a receive completes when its hook runs): only the threads' interleaving
varies. Every run is judged:

- always: never a deadlock (the scheduler halts one at once), no thread left alive, no
  context left in vLLM's module-global maps;
- fault-free, and a microbatch returning without yielding: no error, the outputs merged in
  id order, every receive completed once and before it was read;
- a raising stage: the runner's `RuntimeError("Microbatch i of k failed ...")` caused by the
  injected fault, naming the faulty microbatch where it raised in its own thread.

    python -m harness.vllm_exec.proof --vllm-patch scenarios/vllm/patches/0.34/pr55586-unwind.diff
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from harness.errors import ConfigError, HarnessCannot
from harness.faults import InjectedFault
from harness.runtime.schedule import Exploration, Primitives, Schedule, explore
from harness.runtime.schedule.proof_step import check_step_shape, proof_runs, receive_problem
from harness.vllm_code.source import VllmPatch, read_patch
from harness.vllm_exec.scheduling import VllmScheduling
from harness.vllm_exec.stand_ins import stand_ins_for
from harness.vllm_sut.available import unavailable_reason, vllm_version
from harness.vllm_sut.code import CodeKey, VllmCode, code_for

# FaultKind values of the stages a microbatch thread can fail at (harness/faults.py); a
# SLOW_UBATCH only sleeps holding the turn, which a controlled schedule does not see.
STAGES = ("none", "raise_in_dispatch", "raise_in_combine", "raise_in_recv_hook",
          "raise_in_setup", "raise_in_ubatch", "return_without_yielding")
EXCHANGES = ("dispatch", "combine")
TOKENS_PER_UBATCH = 2
# Stages where the faulty microbatch's own thread raises (not a sibling running its hook).
_OWN_RAISES = ("raise_in_dispatch", "raise_in_combine", "raise_in_ubatch")


@dataclass(frozen=True)
class Step:
    k: int
    stage: str = "none"
    faulty: int = 0  # the microbatch the stage hits (raise_in_setup: the n-th to set up)
    patches: tuple[VllmPatch, ...] = ()
    # As a graph capture runs it: threads started for capture, finished inside the capture.
    capture: bool = False

    def __post_init__(self) -> None:
        check_step_shape(self.k, self.stage, self.faulty, STAGES)


@dataclass
class _Record:
    delivered: list[tuple[int, int]] = field(default_factory=list)  # (owner, exchange)
    raised: list[tuple[int, BaseException]] = field(default_factory=list)  # in the model
    read_early: list[tuple[int, int]] = field(default_factory=list)
    leftovers: tuple[str, ...] = ()


def _model(step: Step, u: Any, record: _Record):
    """What the runner calls as `model(**inputs)` in each microbatch thread."""
    def hook(owner: int, exchange: int):
        def run() -> None:
            if step.stage == "raise_in_recv_hook" and owner == step.faulty:
                raise InjectedFault(f"receive hook of microbatch {owner}")
            record.delivered.append((owner, exchange))
        return run

    def model(input_ids: torch.Tensor, positions: torch.Tensor, **_: object) -> torch.Tensor:
        ub = u.dbo_current_ubatch_id()
        try:
            return layer(ub, input_ids)
        except BaseException as exc:
            record.raised.append((ub, exc))
            raise

    def layer(ub: int, input_ids: torch.Tensor) -> torch.Tensor:
        faulty = ub == step.faulty
        if faulty and step.stage == "return_without_yielding":
            return input_ids.clone()
        for nth, what in enumerate(EXCHANGES):
            u.dbo_maybe_run_recv_hook()
            if faulty and step.stage == f"raise_in_{what}":
                raise InjectedFault(f"microbatch {ub}'s {what}")
            u.dbo_register_recv_hook(hook(ub, nth))
            u.dbo_yield()
            if (ub, nth) not in record.delivered:
                record.read_early.append((ub, nth))
            if faulty and nth == 0 and step.stage == "raise_in_ubatch":
                raise InjectedFault(f"microbatch {ub} after its first yield")
        return input_ids.clone()

    return model


class _Rank:
    """vLLM's runner of one rank as far as a run needs it, on the CPU stand-ins."""

    def __init__(self, step: Step) -> None:
        self.code: VllmCode = code_for(CodeKey(None, step.patches))
        self.stand_ins = stand_ins_for(torch.device("cpu"), 5.0)
        self.stand_ins.install(self.code.ubatching, self.code.runner_module,
                               self.code.cudagraph_utils)
        runner = object.__new__(self.code.runner_module.UBatchRunner)
        streams = self.stand_ins.streams
        # The fields begin_capturable_run and finish read (vLLM's __init__ needs a model).
        runner.__dict__.update(
            num_ubatches=step.k, device=torch.device("cpu"), _pending_finish=None,
            comm_stream=streams.new_stream("vllm-comm"),
            capture_stream=streams.new_stream("vllm-capture"),
            ready_barrier=None, sm_control=contextlib.nullcontext(),
            vllm_config=SimpleNamespace(model_config=SimpleNamespace(dtype=torch.float32)))
        self.runner = runner
        self.scheduling = VllmScheduling(self.code.ubatching, self.code.runner_module, runner,
                                         5.0, 0)

    def state(self, k: int) -> SimpleNamespace:
        n = TOKENS_PER_UBATCH
        slices = [SimpleNamespace(token_slice=slice(i * n, (i + 1) * n),
                                  request_slice=slice(i, i + 1), num_tokens=n)
                  for i in range(k)]
        return SimpleNamespace(slices=slices, forward_contexts=[f"fc{i}" for i in range(k)])

    @contextlib.contextmanager
    def fresh(self, step: Step) -> Iterator[None]:
        """Each run starts as a fresh process would: no context in vLLM's maps, no forward
        context, the set-up fault armed; the forward context put back after."""
        from vllm import forward_context

        u = self.code.ubatching
        u._CURRENT_CONTEXTS[:] = [None] * len(u._CURRENT_CONTEXTS)
        u._THREAD_ID_TO_CONTEXT.clear()
        saved = forward_context._forward_context
        forward_context._forward_context = None
        self.stand_ins.thread_setup.arm(_setup_fault(step))
        try:
            yield
        finally:
            self.stand_ins.thread_setup.arm(None)
            forward_context._forward_context = saved

    def capturing(self, capture: bool) -> contextlib.AbstractContextManager:
        """A capture on the runner's capture stream (the emulated graph), or nothing."""
        if not capture:
            return contextlib.nullcontext()
        cuda = self.stand_ins.proxy.cuda
        return cuda.graph(cuda.CUDAGraph(), stream=self.runner.capture_stream)

    def leftovers(self) -> tuple[str, ...]:
        u = self.code.ubatching
        left = [f"_CURRENT_CONTEXTS[{i}] is set" for i, c in enumerate(u._CURRENT_CONTEXTS)
                if c is not None]
        if u._THREAD_ID_TO_CONTEXT:
            left.append(f"_THREAD_ID_TO_CONTEXT holds {len(u._THREAD_ID_TO_CONTEXT)} thread(s)")
        return tuple(left)


def _setup_fault(step: Step):
    if step.stage != "raise_in_setup":
        return None

    def hook(order: int) -> None:
        if order == step.faulty:
            raise InjectedFault(f"microbatch thread {order}'s device set-up")

    return hook


def scenario_of(step: Step):
    """The step as an `explore` scenario: (record, merged outputs) from the primitives."""
    rank = _Rank(step)
    inputs = {"input_ids": torch.arange(step.k * TOKENS_PER_UBATCH),
              "positions": torch.arange(step.k * TOKENS_PER_UBATCH), "inputs_embeds": None,
              "intermediate_tensors": None}

    def scenario(primitives: Primitives) -> tuple[_Record, Any]:
        record = _Record()
        model = _model(step, rank.code.ubatching, record)
        try:
            with rank.fresh(step), torch.inference_mode(), rank.scheduling.routed(primitives):
                try:
                    finish = rank.runner.begin_capturable_run(model, inputs, rank.state(step.k),
                                                              for_capture=step.capture)
                    with rank.capturing(step.capture):
                        return record, finish()
                finally:
                    record.leftovers = rank.leftovers()
        except BaseException as exc:
            exc.record = record  # type: ignore[attr-defined]  # for the judge
            raise

    return scenario


def judge_of(step: Step):
    """The step's verdict on one run: None when it held, else what broke."""
    def judge(result: Any, error: BaseException | None) -> str | None:
        record: _Record | None = result[0] if result else getattr(error, "record", None)
        if record is None:
            return f"the scenario failed outside the runner: {error!r}"
        if record.leftovers:
            return f"left behind: {', '.join(record.leftovers)} (error: {error!r})"
        for ub, exc in record.raised:
            if not _from_the_fault(exc):
                return f"microbatch {ub} crashed: {exc!r} (not the injected fault, nor raised " \
                       "from it)"
        if step.stage in ("none", "return_without_yielding"):
            return _judge_clean(step, record, result, error)
        return _judge_failed(step, error)

    return judge


def _from_the_fault(exc: BaseException | None) -> bool:
    """The injected fault, or an error raised from it (a sibling released by a fix)."""
    while exc is not None:
        if isinstance(exc, InjectedFault):
            return True
        exc = exc.__cause__
    return False


def _judge_clean(step: Step, record: _Record, result: Any,
                 error: BaseException | None) -> str | None:
    if error is not None:
        return f"a clean step raised {error!r} (cause {error.__cause__!r})"
    expected = torch.arange(step.k * TOKENS_PER_UBATCH)
    if not torch.equal(result[1], expected):
        return f"outputs {result[1].tolist()} are not the microbatches' in id order"
    skipped = step.faulty if step.stage == "return_without_yielding" else None
    return receive_problem(step.k, skipped, len(EXCHANGES), record.delivered, record.read_early)


def _judge_failed(step: Step, error: BaseException | None) -> str | None:
    if type(error) is not RuntimeError or not str(error).startswith("Microbatch "):
        return f"expected the runner's RuntimeError('Microbatch ...'), got {error!r}"
    if not isinstance(error.__cause__, InjectedFault):
        return f"{error} is caused by {error.__cause__!r}, not the injected fault"
    if step.stage in _OWN_RAISES and not str(error).startswith(f"Microbatch {step.faulty} "):
        return f"{error!r} names another microbatch than {step.faulty}, which failed"
    return None


def prove(step: Step, schedule: Schedule, runs: int | None = None,
          safety_s: float = 30.0) -> Exploration:
    """Every schedule (exhaustive; `runs` caps it) or `runs` schedules (random, pct; 100 by
    default) of `step`, each judged; stops at the first finding."""
    return explore(schedule, scenario_of(step), judge_of(step),
                   runs=proof_runs(schedule, runs), safety_s=safety_s)


@dataclass(frozen=True)
class Row:
    step: Step
    bound: int
    found: Exploration
    seconds: float

    def line(self) -> str:
        s, f = self.step, self.found
        return (f"{s.stage:24} {s.faulty:>6} {s.k:>2} {self.bound:>11} {f.visited:>10,} "
                f"{str(f.complete):>8} {str(f.held):>5} {self.seconds:8.1f}")


def proof_rows(steps: list[Step], bounds: range) -> Iterator[Row]:
    """Each step under each preemption bound, exhaustive, timed."""
    for step in steps:
        for bound in bounds:
            start = time.monotonic()
            found = prove(step, Schedule("exhaustive", preemptions=bound))
            yield Row(step, bound, found, time.monotonic() - start)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness.vllm_exec.proof",
                                     description="vLLM's ubatching under every schedule of "
                                     "one step (docs/schedules.md)")
    parser.add_argument("--vllm-patch", action="append", default=[], metavar="FILE",
                        help="a patch over vLLM's ubatching (repeatable; none: vLLM as "
                        "installed)")
    parser.add_argument("--k", type=int, action="append", choices=range(2, 9),
                        help="microbatches (repeatable; default 2 and 3)")
    parser.add_argument("--preemptions", type=int, default=2, choices=range(0, 5),
                        help="the largest preemption bound (each from 0 up runs; default 2)")
    parser.add_argument("--stage", action="append", choices=STAGES,
                        help="fault stage (repeatable; default every one)")
    parser.add_argument("--faulty", type=int, action="append",
                        help="the microbatch the stage hits (repeatable; default every one)")
    parser.add_argument("--capture", action="store_true",
                        help="run the step as a graph capture runs it (threads started for "
                        "capture, finished inside the emulated capture)")
    return parser


def _steps(args: argparse.Namespace, patches: tuple[VllmPatch, ...]) -> list[Step]:
    steps = []
    for k in args.k or [2, 3]:
        for stage in args.stage or STAGES:
            faulty = [0] if stage == "none" else args.faulty or range(k)
            steps += [Step(k, stage, f, patches, args.capture) for f in faulty if f < k]
    return steps


def main(argv: list[str] | None = None) -> int:
    """0: every schedule held within every bound; 1: a finding (printed with the schedule
    that replays it); 2: bad input; 3: vLLM cannot be driven here."""
    parser = _parser()
    args = parser.parse_args(argv)
    if any(not 0 <= f < max(args.k or [3]) for f in args.faulty or ()):
        parser.error(f"--faulty: each a microbatch below the largest k, not {args.faulty}")
    if vllm_version() is None:
        print(f"cannot: {unavailable_reason()}", file=sys.stderr)
        return 3
    try:
        patches = tuple(read_patch(p) for p in args.vllm_patch)
        steps = _steps(args, patches)
        print(f"vLLM {vllm_version()}, patches: {', '.join(p.name for p in patches) or 'none'}"
              f"{', as a capture' if args.capture else ''}")
        print(f"{'stage':24} {'faulty':>6} {'k':>2} {'preemptions':>11} {'schedules':>10} "
              f"{'complete':>8} {'held':>5} {'seconds':>8}", flush=True)
        held = True
        for row in proof_rows(steps, range(args.preemptions + 1)):
            print(row.line(), flush=True)
            held = held and row.found.held and row.found.complete
            for finding in row.found.findings[:1]:
                print(f"    {finding.verdict.splitlines()[0]}\n    replay: "
                      f"{json.dumps(finding.trace.schedule.to_json())}", flush=True)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except HarnessCannot as exc:
        print(f"cannot: {exc}", file=sys.stderr)
        return 3
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
