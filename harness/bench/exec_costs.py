"""`make bench`'s rows for a world that executes vLLM's own code (`--exec vllm`, 2 torchrun
ranks over gloo on CPU): what its cold start, a faulted example and a fault-free one cost,
and where each rank's time goes.

- cold start: torchrun, every rank importing torch and vLLM's execution code, the group;
- a hang (#55586's: vLLM parks a microbatch thread for good), from its start to the deadline
  that proves it, then from that deadline until the next example runs (the stacks, the
  world's end, a relaunch or a spare taken): for its rerun, run at once as the search
  confirms a failure, and for the clean example after that (a third world in a row);
- fault-free examples/s: the fault-free `--exec vllm` search's own draws (`vllm-exec`, the
  harness deciding), one per round trip, judged as the search judges them, after clean
  examples for SETTLE_COLD_STARTS cold starts (a search's first fault comes that late);
- per phase: the imports (a fresh interpreter), the CPU of a cold start's processes, then per
  example the capture, the steps, the judge, and the rest (the runtime's build,
  messages, the driver's reading).

`python -m harness.bench.exec_costs [--against DIR]` prints the rows; with `--against`, the
same rows measured first on the checkout at DIR (a `git worktree` of an older commit), side
by side with this one, in one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from harness.bench.detection import known_fixes
from harness.cli_vllm import release_of
from harness.fuzz.engine import FUZZ_TIMEOUTS, scenario_strategy
from harness.fuzz.variants import EXEC_VARIANTS
from harness.reference_plans import judge_run as judge
from harness.scenario import Scenario, scenario_from_dict
from harness.world.processes.lifecycle import package_pythonpath
from harness.world.torchrun.world import TorchrunWorld

# A microbatch thread whose device set-up raises: vLLM parks its sibling for good.
HANG_FAULTS = [{"kind": "raise_in_setup", "rank": 0, "step": 0, "ubatch": 0}]
HANG_CONFIG = {"cudagraph_mode": "NONE", "capture_sizes": [4], "max_num_reqs": 8,
               "max_num_batched_tokens": 16, "decode_threshold": 4, "prefill_threshold": 4,
               "num_ubatches": 2, "sut": "vllm", "execution": "vllm", "dp_size": 2}
# Clean examples before the rows, for this many cold starts: a search's first fault comes
# after a minute or so, and the spares of a world that has them boot meanwhile.
SETTLE_COLD_STARTS = 2.5
IMPORT_CODE = ("import time; t = time.perf_counter(); import torch; u = time.perf_counter(); "
               "from harness.vllm_exec import runtime_class; runtime_class(); "
               "print(u - t, time.perf_counter() - u)")


def exec_examples(count: int, seed: int = 0) -> list[Scenario]:
    """What the fault-free `--exec vllm` search (the harness deciding) draws first."""
    drawn: list[Scenario] = []
    release = release_of(None).value
    # vLLM with the project's fixes: its own findings (0.34's request slices, drawn since the
    # split-step draws) would fail a fault-free example and stop the measure.
    fixed = {"execution": "vllm", "dp_size": 2, "release": release,
             "vllm_patches": known_fixes(release)}
    strategy = scenario_strategy(EXEC_VARIANTS["vllm-exec"], fixed, (2,))

    @hypothesis_seed(seed)
    @settings(max_examples=count, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def draw(scenario: Scenario) -> None:
        drawn.append(dataclasses.replace(scenario, faults=()))

    draw()
    return drawn[:count]


def hang_example() -> Scenario:
    config = {**HANG_CONFIG, "release": release_of(None).value}
    return scenario_from_dict({"name": "bench-hang", "config": config,
                               "steps": [{"ranks": [8, 8]}], "faults": HANG_FAULTS})


@dataclass
class Phases:
    """Seconds per phase, summed over the fault-free examples."""

    capture: float = 0.0
    step: float = 0.0
    judge: float = 0.0
    rest: float = 0.0


def fault_free(world: TorchrunWorld, examples: list[Scenario]) -> tuple[float, Phases]:
    """Examples per second, one per round trip, judged as the search judges them."""
    phases = Phases()
    start = time.perf_counter()
    for example in examples:
        began = time.perf_counter()
        history = world.run(example)
        ran = time.perf_counter()
        result = judge(history)
        judged = time.perf_counter()
        assert result.ok, result.failed_verdicts()
        fresh = history.startup and not history.batched
        capture = max(r.seconds for r in history.startup) if fresh else 0.0
        steps = sum(max(r.seconds for r in step) for step in history.steps)
        phases.capture += capture
        phases.step += steps
        phases.judge += judged - ran
        phases.rest += max(0.0, ran - began - capture - steps)
    return len(examples) / (time.perf_counter() - start), phases


def hang_costs(world: TorchrunWorld, then: Scenario) -> tuple[float, float]:
    """(the hung example from its start to the deadline that proves the hang, that deadline
    to the example after it running): the deadline is when the driver asks for the stacks;
    the next example runs once the world is back (a relaunch, or a spare taken)."""
    noted: list[float] = []
    evidence = world.rig.rank_evidence

    def timed_evidence(*args, **kwargs):
        noted.append(time.perf_counter())
        return evidence(*args, **kwargs)

    world.rig.rank_evidence = timed_evidence
    try:
        began = time.perf_counter()
        history = world.run(hang_example())
        hung = not judge(history).ok and "deadline" in history.evidence
        after = time.perf_counter()
        starts = len(world.clock.starts)
        world.run(then)
    finally:
        world.rig.rank_evidence = evidence
    if not (hung and noted):
        raise RuntimeError(f"the hang example did not hang: {history.evidence[:200]}")
    back = world.clock.starts[-1] if len(world.clock.starts) > starts else 0.0
    return noted[0] - began, (after - noted[0]) + back


def import_seconds() -> tuple[float, float]:
    """(import torch, then vLLM's execution code) in a fresh interpreter, as a rank does."""
    out = subprocess.run([sys.executable, "-c", IMPORT_CODE], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": package_pythonpath()})
    torch_s, vllm_s = (float(x) for x in out.stdout.split()[-2:])
    return torch_s, vllm_s


def settle(world: TorchrunWorld, examples: list[Scenario], seconds: float) -> None:
    """Clean examples for `seconds`, as a search runs before its first fault: a world's
    spares (two at once, beside it) boot meanwhile."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        for example in examples:
            judge(world.run(example))
            if time.perf_counter() >= until:
                return


def cold_start_cpu() -> float:
    """The CPU a vLLM world's start costs: torchrun's agent and every rank (each importing
    torch and vLLM, or forked from a zygote that imported them once), on a world without
    spares, so that nothing else is booting."""
    import psutil

    with TorchrunWorld(2, "gloo", FUZZ_TIMEOUTS, preload_vllm=True, spares=0) as world:
        world.start()
        return sum(sum(p.cpu_times()[:2]) for p in psutil.Process().children(recursive=True))


def measure(count: int) -> dict[str, float]:
    """Every row of this checkout, in seconds (rates in examples/s)."""
    torch_s, vllm_s = import_seconds()
    examples = exec_examples(count)
    with TorchrunWorld(2, "gloo", FUZZ_TIMEOUTS, preload_vllm=True) as world:
        world.start()
        settle(world, examples, SETTLE_COLD_STARTS * world.clock.starts[0])
        rate, phases = fault_free(world, examples)
        # A hang, rerun at once as the search confirms a failure, then a clean example.
        to_deadline, to_rerun = hang_costs(world, hang_example())
        _, to_clean = hang_costs(world, examples[0])
        starts = world.clock.starts
    n = len(examples)
    return {"cold start": starts[0], "world back after a failure (median)":
            statistics.median(starts[1:]), "hang: start to deadline": to_deadline,
            "deadline to the rerun running": to_rerun,
            "deadline to the next example running": to_clean, "fault-free examples/s": rate,
            "rank: import torch": torch_s, "rank: import vLLM's code": vllm_s,
            "cold start: CPU seconds of its processes (no spares)": cold_start_cpu(),
            "per example: capture": phases.capture / n, "per example: steps": phases.step / n,
            "per example: judge": phases.judge / n,
            "per example: runtime build + transport": phases.rest / n}


def _measured_in(tree: str, count: int) -> dict[str, float]:
    """The rows of the checkout at `tree`, measured by this module's code in a child."""
    code = ("import json, runpy, sys; from harness.runtime.intra_op import one_intra_op_thread; "
            f"one_intra_op_thread(); ns = runpy.run_path({__file__!r}); "
            f"print('ROWS', json.dumps(ns['measure']({count})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tree, timeout=1800, env={**os.environ, "PYTHONPATH": tree})
    rows = [line for line in out.stdout.splitlines() if line.startswith("ROWS ")]
    if out.returncode or not rows:
        raise RuntimeError(f"measuring {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(rows[-1][5:])


def print_exec_costs(count: int, against: str | None = None) -> None:
    from harness.vllm_sut.available import unavailable_reason, vllm_version

    if vllm_version() is None:
        print(f"\n--exec vllm rows skipped: {unavailable_reason()}")
        return
    here = str(Path(__file__).resolve().parents[2])
    before = _measured_in(against, count) if against else None
    now = _measured_in(here, count)
    print(f"\n--exec vllm on the 2-rank torchrun world (gloo, CPU), {count} fault-free "
          "examples; seconds unless named")
    head = f"{'row':48} " + (f"{'before':>9} " if before else "") + f"{'now':>9}"
    print(head)
    for name, value in now.items():
        old = f"{before[name]:9.3f} " if before else ""
        print(f"{name:48} {old}{value:9.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.bench.exec_costs")
    parser.add_argument("--examples", type=int, default=40, help="fault-free examples")
    parser.add_argument("--against", metavar="DIR",
                        help="an older checkout (git worktree) measured first, side by side")
    args = parser.parse_args(argv)
    if args.examples < 1:
        parser.error(f"--examples: a count of examples, 1 or more, not {args.examples}")
    if args.against and not (Path(args.against) / "harness").is_dir():
        parser.error(f"--against: {args.against} holds no harness checkout")
    print_exec_costs(args.examples, args.against)
    return 0


if __name__ == "__main__":
    from harness.runtime.intra_op import one_intra_op_thread

    one_intra_op_thread()
    sys.exit(main())
