"""`python -m harness fuzz --jobs N`: N fuzz processes on this machine, one seed each,
sharing one example database; their run logs merged into the one `--log`.

Each job is `python -m harness.fuzz.job` in a session of its own (so that its world, torchrun
included, goes with it), started with the parent's flags, a seed of its own and a log of its
own, printing one JSON object per variant. The parent waits for them under one bound, ends
a job that outlives it (SIGTERM, then SIGKILL to its whole session) and checks that nothing
of a job survives it.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from harness.check.coverage import coverage_from_dicts, coverage_lines, merged
from harness.fuzz.engine import Budget
from harness.fuzz.variants import FOUND, did_its_job, expects_a_finding, variant_detection

START_SLACK_S = 120.0  # per variant: a world's start-up and the last shrink pass
KILL_GRACE_S = 10.0
SECONDS_PER_EXAMPLE_BOUND = 30.0  # when only --examples bounds a job: a slow example's worst


@dataclass(frozen=True)
class JobResult:
    index: int  # 1-based
    seed: int
    code: int | None  # None: ended by the parent's bound
    outcomes: tuple[dict[str, Any], ...]
    log: Path
    error: str  # the job's last line on stderr
    stderr: Path  # all of it, kept beside the log when the job failed
    leftover: tuple[int, ...]  # pids of its session that outlived it (then killed)


def job_seeds(base: int | None, jobs: int) -> tuple[int, ...]:
    """Seeds one apart from `base` (or from a fresh random base), so the jobs search apart."""
    start = secrets.randbits(31) if base is None else base
    return tuple(start + i for i in range(jobs))


def jobs_bound_s(budget: Budget, variants: int) -> float:
    """How long the parent waits for all jobs: every variant's search, shrink and start-up."""
    search = budget.seconds if budget.seconds is not None else \
        (budget.examples or 0) * SECONDS_PER_EXAMPLE_BOUND
    return variants * (search + budget.shrink_seconds + START_SLACK_S)


def job_arguments(args: argparse.Namespace, seed: int, log: Path) -> dict[str, Any]:
    """The parent's flags for one job: its seed, its log, JSON out, one process."""
    fields = {k: v for k, v in vars(args).items() if k != "func"}
    return {**fields, "jobs": 1, "hypothesis_seed": seed, "log": str(log), "json": True,
            "progress": False}


def run_jobs(args: argparse.Namespace, variants: list[str], budget: Budget) -> int:
    seeds = job_seeds(args.hypothesis_seed, args.jobs)
    with tempfile.TemporaryDirectory(prefix="harness-jobs-") as tmp:
        results = _run_all(args, seeds, Path(tmp), jobs_bound_s(budget, len(variants)),
                           len(variants))
        merge_logs([r.log for r in results], Path(args.log))
    return report_jobs(results, variants, args.database, args.json)


def _run_all(args: argparse.Namespace, seeds: tuple[int, ...], tmp: Path,
             bound_s: float, variants: int) -> list[JobResult]:
    env = {**os.environ, "PYTHONPATH": _with_package_root(os.environ.get("PYTHONPATH"))}
    started = []
    for index, seed in enumerate(seeds, 1):
        log = tmp / f"job-{index}.jsonl"
        spec = tmp / f"job-{index}.json"
        spec.write_text(json.dumps(job_arguments(args, seed, log)))
        out, err = (tmp / f"job-{index}.out").open("w"), (tmp / f"job-{index}.err").open("w")
        proc = subprocess.Popen([sys.executable, "-m", "harness.fuzz.job", str(spec)],
                                stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
        started.append((index, seed, proc, log, out, err))
    deadline = time.monotonic() + bound_s
    results = []
    for index, seed, proc, log, out, err in started:
        code = _wait_or_end(proc, deadline)
        leftover = _end_session(proc.pid)
        out.close()
        err.close()
        kept = Path(args.log).with_name(f"{Path(args.log).name}.job{index}.err")
        result = JobResult(index, seed, code, _outcomes(tmp / f"job-{index}.out"), log,
                           _last_line(tmp / f"job-{index}.err"), kept, leftover)
        if job_failure(result, variants):
            kept.write_text((tmp / f"job-{index}.err").read_text(errors="replace"))
        results.append(result)
    return results


def _with_package_root(path: str | None) -> str:
    # The jobs import this very harness, wherever the parent was started from.
    root = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join([root, *([path] if path else [])])


def _wait_or_end(proc: subprocess.Popen, deadline: float) -> int | None:
    try:
        return proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    return None


def _end_session(sid: int) -> tuple[int, ...]:
    """Pids of the job's session still alive after it ended; they are killed."""
    left = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    if left:
        try:
            os.killpg(sid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return tuple(left)


def _outcomes(path: Path) -> tuple[dict[str, Any], ...]:
    found = []
    for line in path.read_text().splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and "variant" in value:
            found.append(value)
    return tuple(found)


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def merge_logs(parts: list[Path], into: Path) -> None:
    """Every job's log appended to the one log, job by job (a report reads them as one)."""
    into.parent.mkdir(parents=True, exist_ok=True)
    with into.open("a") as f:
        for part in parts:
            if part.exists():
                f.write(part.read_text())


def job_failure(result: JobResult, variants: int) -> str | None:
    """Why a job did not do its part, or None."""
    if result.code is None:
        return f"job {result.index} (seed {result.seed}) ran past the campaign's bound and " \
               "was ended"
    if result.leftover:
        return f"job {result.index}: processes of its world outlived it: {list(result.leftover)}"
    if result.code not in (0, 1) or len(result.outcomes) != variants:
        return f"job {result.index} (seed {result.seed}) ended with exit code {result.code}" \
               f" after {len(result.outcomes)} of {variants} variants: {result.error} (its " \
               f"stderr: {result.stderr})"
    return None


def campaign_exit(results: list[JobResult], variants: list[str]) -> int:
    """2 when a job refused its input, 3 when the harness could not do a job's part, 1 when
    one failed or something was found (with one variant) or a job missed its goal (with
    several), else 0."""
    if any(r.code == 2 for r in results):
        return 2
    if any(r.code == 3 for r in results):
        return 3
    if any(job_failure(r, len(variants)) for r in results):
        return 1
    outcomes = [o for r in results for o in r.outcomes]
    if len(variants) == 1:
        return 1 if any(o["found"] for o in outcomes) else 0
    return 0 if all(did_its_job(o["variant"], o["found"], o["checker"]) for o in outcomes) else 1


def job_verdict(outcome: dict[str, Any]) -> str:
    """clean, FOUND, or "found as X" for a planted bug a checker that does not name it showed."""
    if not outcome["found"]:
        return "clean"
    shown = variant_detection(outcome["variant"], True, outcome["checker"])
    return shown if expects_a_finding(outcome["variant"]) and shown != FOUND else "FOUND"


def report_jobs(results: list[JobResult], variants: list[str], database: str,
                as_json: bool) -> int:
    for r in results:
        problem = job_failure(r, len(variants))
        if problem:
            print(f"error: {problem}", file=sys.stderr)
    if as_json:
        for r in results:
            for o in r.outcomes:
                print(json.dumps({**o, "job": r.index, "seed": r.seed}))
        return campaign_exit(results, variants)
    seeds = ", ".join(str(r.seed) for r in results)
    print(f"fuzz campaign: {len(results)} jobs (seeds {seeds}) sharing {database}")
    print(f"{'job':>3} {'seed':>11} {'variant':24} {'verdict':7} {'checker':20} {'finding':18} "
          f"{'found by':8} {'to detection':>14} {'examples':>8} {'replayed':>8} "
          f"{'restarts':>8}")
    for r in results:
        for o in r.outcomes:
            detect = (f"{o['examples_to_detection']} / {o['seconds_to_detection']:.1f}s"
                      if o["found"] else "-")
            print(f"{r.index:>3} {r.seed:>11} {o['variant']:24} "
                  f"{job_verdict(o):7} {o['checker'] or '-':20} {o.get('kind') or '-':18} "
                  f"{o.get('found_by') or '-':8} {detect:>14} {o['examples']:>8} "
                  f"{o.get('replayed', 0):>8} {o.get('restarts', 0):>8}")
    for variant in variants:
        replay = next((o["replay"] for r in results for o in r.outcomes
                       if o["variant"] == variant and o["replay"]), None)
        if replay:
            print(f"{variant}: {replay}")
    _print_coverage(results)
    return campaign_exit(results, variants)


def _print_coverage(results: list[JobResult]) -> None:
    """Each checker's verdicts over every job's examples, from the jobs' JSON."""
    outcomes = [o for r in results for o in r.outcomes]
    try:
        coverage = merged(coverage_from_dicts(o.get("coverage", ())) for o in outcomes)
    except ValueError as exc:
        print(f"coverage: a job's JSON does not read ({exc})")
        return
    examples = sum(o["examples"] for o in outcomes)
    print("\n".join(coverage_lines(coverage, f"{examples} examples of {len(results)} jobs")))
