"""`make bench`'s schedule cost rows (issue 45 item 5): examples/s and per-step time of the
same eager microbatched steps under each schedule mode, `os` beside the controlled ones, on the
miniature's ring protocol and on vLLM's own ubatching (`exec: vllm`), one 2-rank torchrun
world each (gloo). Modes are fed in alternating slices so a shared machine's load falls on
all alike. `exhaustive` runs take seeds 0, 1, ... of its numbered schedules (wrapping), so a
row mixes schedules with up to its bound of preemptions.

    python -m harness.bench.schedules [--examples N]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from harness.runtime.schedule.bounded import schedules_within
from harness.runtime.schedule.descriptor import OS_SCHEDULE, Schedule
from harness.scenario import Scenario, scenario_from_dict
from harness.timeouts import Timeouts

DEFAULT_EXAMPLES = 40
# Eager steps split in two microbatches (no graph: a replay starts no thread to schedule).
CONFIG = {"cudagraph_mode": "NONE", "max_num_reqs": 16, "max_num_batched_tokens": 32,
          "decode_threshold": 4, "prefill_threshold": 16}
PROTOCOLS = ("miniature ring", "vllm ubatching.py")


@dataclass(frozen=True)
class ScheduleRow:
    protocol: str
    mode: str  # "os", "random", "pct", "exhaustive p=N"
    examples: int
    seconds: float
    step_ms: float  # the slowest rank's step, median
    skipped: str = ""  # why the row did not run

    @property
    def per_second(self) -> float:
        return self.examples / self.seconds if self.seconds else 0.0


def modes() -> list[tuple[str, Callable[[int], Schedule]]]:
    """(row name, the schedule of the i-th example) per mode, `os` first."""
    def exhaustive(bound: int) -> Callable[[int], Schedule]:
        count = schedules_within(bound, Schedule().steps)
        return lambda i: Schedule("exhaustive", seed=i % count, preemptions=bound)

    return [("os", lambda i: OS_SCHEDULE),
            ("random", lambda i: Schedule("random", seed=i)),
            ("pct", lambda i: Schedule("pct", seed=i)),
            *((f"exhaustive p={b}", exhaustive(b)) for b in (0, 1, 2))]


def examples(count: int, vllm: bool, seed: int = 0) -> list[Scenario]:
    """One-step 2-rank scenarios, each rank 6 to 16 tokens (split in two microbatches)."""
    rng = random.Random(seed)
    config = dict(CONFIG)
    if vllm:
        from harness.vllm_sut.available import installed_release

        config.update(execution="vllm", sut="vllm", release=installed_release().value)
    return [scenario_from_dict({"name": f"schedule-bench-{i}", "config": config,
                                "steps": [{"ranks": [{"tokens": rng.randint(6, 16)}
                                                     for _ in range(2)]}]})
            for i in range(count)]


def vllm_unavailable() -> str | None:
    """Why vLLM's rows cannot run here, or None."""
    from harness.vllm_sut.available import unavailable_reason, vllm_version

    return None if vllm_version() is not None else unavailable_reason()


def protocol_rows(protocol: str, count: int, rounds: int = 4) -> list[ScheduleRow]:
    """Every mode's row for one protocol, on one torchrun world."""
    from harness.reference_plans import judge_run
    from harness.world.torchrun.world import TorchrunWorld

    vllm = protocol == PROTOCOLS[1]
    if vllm and (reason := vllm_unavailable()):
        return [ScheduleRow(protocol, name, 0, 0.0, 0.0, reason) for name, _ in modes()]
    cases = examples(count, vllm)
    seconds = {name: 0.0 for name, _ in modes()}
    steps: dict[str, list[float]] = {name: [] for name, _ in modes()}
    with TorchrunWorld(2, "gloo", timeouts=Timeouts()) as world:
        world.start()
        world.run(cases[0])  # start-up (captures, imports) outside the timings
        size = -(-count // rounds)
        for low in range(0, count, size):
            for name, schedule_of in modes():
                start = time.perf_counter()
                for i in range(low, min(count, low + size)):
                    result = judge_run(world.run(replace(cases[i], schedule=schedule_of(i))))
                    if not result.ok:
                        raise RuntimeError(f"{protocol} under {name}, example {i}: "
                                           f"{result.failed_verdicts()[:1]}")
                    records = result.steps[0].records
                    _check_scheduled(records, name, i)
                    steps[name].append(max(r.seconds for r in records))
                seconds[name] += time.perf_counter() - start
    return [ScheduleRow(protocol, name, count, seconds[name],
                        1000 * statistics.median(steps[name])) for name, _ in modes()]


def _check_scheduled(records, name: str, i: int) -> None:
    """A row times what it names: a microbatched eager step, its choices recorded when
    controlled (none under `os`)."""
    for r in records:
        if r.executed != "eager-microbatched":
            raise RuntimeError(f"example {i} ran {r.executed!r} on rank {r.rank}, not an "
                               "eager microbatched step: nothing to schedule")
        if (r.schedule_choices is None) != (name == "os"):
            raise RuntimeError(f"example {i} under {name}: choices {r.schedule_choices!r}")


def print_schedule_rows(rows: list[ScheduleRow]) -> None:
    print(f"\n{'protocol (2-rank torchrun, gloo)':34} {'schedule':15} {'examples':>8} "
          f"{'seconds':>8} {'examples/s':>10} {'step ms':>8} {'x os':>6}")
    base = {row.protocol: row for row in rows if row.mode == "os"}
    for row in rows:
        if row.skipped:
            print(f"{row.protocol:34} {row.mode:15} skipped: {row.skipped}")
            continue
        os_row = base.get(row.protocol)
        slower = (f"{os_row.per_second / row.per_second:6.2f}"
                  if os_row and row.per_second else f"{'-':>6}")
        print(f"{row.protocol:34} {row.mode:15} {row.examples:>8} {row.seconds:8.2f} "
              f"{row.per_second:10.1f} {row.step_ms:8.2f} {slower}")
    print("x os: how many times slower than the os row of the same protocol (examples/s)")


def _count(text: str) -> int:
    """A count of examples, 0 or more (argparse names the flag on a bad one: exit 2)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"a count of examples, 0 or more, not {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--schedule-examples", type=_count, default=DEFAULT_EXAMPLES,
                        metavar="N", help="examples per schedule mode and protocol in the "
                        "schedule cost rows (0: skip those rows)")


def run_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The rows `args` ask for (none for 0)."""
    if args.schedule_examples:
        print_schedule_rows([row for protocol in PROTOCOLS
                             for row in protocol_rows(protocol, args.schedule_examples)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.bench.schedules")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if not args.schedule_examples:
        parser.error("--schedule-examples: 0 skips the only rows this command prints")
    run_from_args(parser, args)
    return 0


if __name__ == "__main__":
    from harness.runtime.intra_op import one_intra_op_thread

    one_intra_op_thread()
    sys.exit(main())
