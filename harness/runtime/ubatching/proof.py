"""The ring protocol under every schedule of one step (docs/schedules.md).

One step of k microbatches shaped as the MoE layer drives them: per exchange (dispatch, then
combine) run the receive left for me, leave mine for the next microbatch, yield, then read
what I received. `prove` runs it under `--schedule exhaustive` (or a random or pct series),
fault-free or with one fault stage in one microbatch, and judges each run:

- fault-free (and a microbatch returning without yielding): the outputs in id order, every
  receive completed exactly once and before its microbatch read it;
- a raising stage: `MicrobatchFailed`, caused by the injected error (and naming the faulty
  microbatch where it raised in its own thread), never a hang; a set-up failure: the start
  itself fails (`begin_run` raises), as `MicrobatchThreads` documents;
- always: no protocol error (two threads holding the turn) and no thread left alive.

    python -m harness.runtime.ubatching.proof   # the exhaustive counts, k = 2 and 3
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from harness.faults import InjectedFault
from harness.runtime.schedule import Exploration, Primitives, Schedule, explore
from harness.runtime.schedule.proof_step import check_step_shape, proof_runs, receive_problem
from harness.runtime.streams import CpuStreams
from harness.runtime.ubatching.binding import current_context
from harness.runtime.ubatching.errors import MicrobatchFailed
from harness.runtime.ubatching.ring import UBatchContext
from harness.runtime.ubatching.threads import MicrobatchThreads

STAGES = ("none", "raise_at_entry", "raise_after_yield", "raise_in_recv_hook",
          "raise_in_setup", "return_without_yielding")
EXCHANGES = 2  # dispatch, combine
# Faults that make the faulty microbatch itself raise (not a sibling running its hook).
_OWN_RAISES = ("raise_at_entry", "raise_after_yield", "raise_in_setup")


@dataclass(frozen=True)
class Step:
    k: int
    variant: str = "abortable"
    stage: str = "none"
    faulty: int = 0  # the microbatch the fault stage hits

    def __post_init__(self) -> None:
        check_step_shape(self.k, self.stage, self.faulty, STAGES)


@dataclass
class _Record:
    delivered: list[tuple[int, int]] = field(default_factory=list)  # (registrant, exchange)
    read_early: list[tuple[int, int]] = field(default_factory=list)
    runner: MicrobatchThreads | None = None


def _body(step: Step, record: _Record):
    def hook(owner: int, exchange: int):
        def run() -> None:
            if step.stage == "raise_in_recv_hook" and owner == step.faulty:
                raise InjectedFault(f"recv hook of microbatch {owner}")
            record.delivered.append((owner, exchange))
        return run

    def body(ctx: UBatchContext) -> int:
        faulty = ctx.id == step.faulty
        if faulty and step.stage == "return_without_yielding":
            return ctx.id
        if faulty and step.stage == "raise_at_entry":
            raise InjectedFault(f"microbatch {ctx.id} at entry")
        for exchange in range(EXCHANGES):
            ctx.maybe_run_recv_hook()
            ctx.register_recv_hook(hook(ctx.id, exchange))
            ctx.yield_()
            if faulty and step.stage == "raise_after_yield":
                raise InjectedFault(f"microbatch {ctx.id} after its yield")
            if (ctx.id, exchange) not in record.delivered:
                record.read_early.append((ctx.id, exchange))
        ctx.maybe_run_recv_hook()
        return ctx.id

    return body


def scenario_of(step: Step):
    """The step as an `explore` scenario: (record, outputs) from the primitives given."""
    def setup() -> None:
        ctx = current_context()
        if step.stage == "raise_in_setup" and ctx is not None and ctx.id == step.faulty:
            raise InjectedFault(f"microbatch {ctx.id} in its set-up")

    def scenario(primitives: Primitives) -> tuple[_Record, list[Any]]:
        record = _Record()
        record.runner = MicrobatchThreads(step.variant, hang_timeout_s=30.0,
                                          poll_interval_s=0.02, barrier_timeout_s=10.0,
                                          primitives=primitives)
        streams = CpuStreams()
        try:
            finish = record.runner.begin_run([_body(step, record)] * step.k, streams,
                                             streams.new_stream("compute"), setup=setup)
            return record, finish()
        except BaseException as exc:
            exc.record = record  # type: ignore[attr-defined]  # for the judge
            raise

    return scenario


def judge_of(step: Step):
    """The step's verdict on one run: None when it held, else what broke."""
    def judge(result: Any, error: BaseException | None) -> str | None:
        record: _Record | None = result[0] if result else getattr(error, "record", None)
        if record is None:
            return f"the scenario failed outside the protocol: {error!r}"
        runner = record.runner
        if runner.protocol_errors:
            return f"protocol error: {runner.protocol_errors[0]}"
        if runner.alive_threads():
            return f"threads still alive: {[t.name for t in runner.alive_threads()]}"
        if step.stage in ("none", "return_without_yielding"):
            return _judge_clean(step, record, result, error)
        if step.stage == "raise_in_setup":
            # begin_run's own contract: a thread that fails before the ready barrier breaks
            # it, and the start raises (RuntimeError), never a hang.
            failed_start = type(error) is RuntimeError  # not a MicrobatchHang nor Failed
            return None if failed_start else f"expected the start to fail, got {error!r}"
        return _judge_failed(step, error)

    return judge


def _judge_clean(step: Step, record: _Record, result: Any,
                 error: BaseException | None) -> str | None:
    if error is not None:
        return f"a clean step raised {error!r}"
    if result[1] != list(range(step.k)):
        return f"outputs {result[1]} are not in id order"
    skipped = step.faulty if step.stage == "return_without_yielding" else None
    return receive_problem(step.k, skipped, EXCHANGES, record.delivered, record.read_early)


def _judge_failed(step: Step, error: BaseException | None) -> str | None:
    if not isinstance(error, MicrobatchFailed):
        return f"expected MicrobatchFailed, got {error!r}"
    if not isinstance(error.__cause__, InjectedFault):
        return f"the failure's cause is {error.__cause__!r}, not the injected fault"
    if step.stage in _OWN_RAISES and error.ubatch != step.faulty:
        return f"names microbatch {error.ubatch}, but {step.faulty} failed"
    return None


def prove(step: Step, schedule: Schedule, runs: int | None = None,
          safety_s: float = 30.0) -> Exploration:
    """Every schedule (exhaustive; `runs` caps it) or `runs` schedules (random, pct; 100 by
    default) of `step`, each judged."""
    return explore(schedule, scenario_of(step), judge_of(step),
                   runs=proof_runs(schedule, runs), safety_s=safety_s)


def main(argv: list[str] | None = None) -> int:
    """Exhaustive counts per k and preemption bound (0 up to `--preemptions`), one stage."""
    parser = argparse.ArgumentParser(prog="python -m harness.runtime.ubatching.proof")
    parser.add_argument("--k", type=int, action="append", help="microbatches (repeatable; "
                        "default 2 and 3)")
    parser.add_argument("--preemptions", type=int, default=2, help="largest bound (default 2)")
    parser.add_argument("--stage", choices=STAGES, default="none")
    parser.add_argument("--faulty", type=int, default=0, help="the microbatch the stage hits")
    parser.add_argument("--variant", default="abortable")
    args = parser.parse_args(argv)
    print("variant    stage  k  preemptions  schedules  complete  held  seconds")
    held = True
    for k in args.k or [2, 3]:
        for bound in range(args.preemptions + 1):
            start = time.monotonic()
            found = prove(Step(k, args.variant, args.stage, args.faulty),
                          Schedule("exhaustive", preemptions=bound))
            held = held and found.held and found.complete
            print(f"{args.variant}  {args.stage}  {k}  {bound:<11}  {found.visited:<9}  "
                  f"{str(found.complete):<8}  {str(found.held):<4}  "
                  f"{time.monotonic() - start:.1f}", flush=True)
            for finding in found.findings[:1]:
                print(f"   {finding.verdict}\n   replay: "
                      f"{json.dumps(finding.trace.schedule.to_json())}")
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
