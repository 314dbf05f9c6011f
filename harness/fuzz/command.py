"""`python -m harness fuzz`: search DP skew for a scenario some checker rejects, on a world.

Exit 0 when nothing is found, 1 with the shrunk scenario when something is (an intermittent
failure too), 2 on bad input. With `--variant all` every variant is fuzzed in turn and the
exit code says whether the fuzzer did its job: 0 when each planted bug was found as itself
(by a checker that names it) and the reference stayed clean.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from harness.check.coverage import coverage_lines, merged
from harness.cli_config import (
    add_config_flags,
    add_timeout_flags,
    config_fields_from_args,
    output_dir,
    output_file,
    timeouts_from_args,
)
from harness.cli_schedule import add_schedule_flags
from harness.cli_vllm import (
    add_vllm_flags,
    replay_flags,
    tested_vllm,
    tested_vllm_json,
    vllm_fields,
)
from harness.config import HarnessConfig, ubatching_fields
from harness.config_values import check_seconds
from harness.errors import ConfigError
from harness.fuzz.database import is_url, open_database
from harness.fuzz.engine import FUZZ_TIMEOUTS, SIM_DP_SIZES, Budget, FuzzOutcome, fuzz
from harness.fuzz.profiles import PROFILES, profile_from_environment
from harness.fuzz.progress import ProgressBar
from harness.fuzz.run_log import DEFAULT_LOG
from harness.fuzz.schedules import space_from_args
from harness.fuzz.unsteered import unsteered
from harness.fuzz.variants import (
    EXEC_DEFAULT_HUNTS,
    EXEC_VARIANTS,
    FOUND,
    SUT_VARIANTS,
    VARIANTS,
    Variant,
    detection,
    did_its_job,
    expects_a_finding,
    variant_detection,
    variant_named,
)
from harness.world import WORLDS, add_backend_flags, check_execution_backend
from harness.world.pool import WorldPool

DEFAULT_SECONDS = 60.0
DEFAULT_DATABASE = ".hypothesis/fuzz"
MAX_JOBS = 64  # processes on one machine; more machines each run their own


def add_fuzz_command(sub) -> argparse.ArgumentParser:
    fz = sub.add_parser("fuzz", help="search skewed DP steps for a scenario a checker rejects, "
                        "shrink it and print how to replay it")
    fz.add_argument("--variant", default="reference", metavar="NAME",
                    help=f"the system to fuzz: {', '.join(VARIANTS)}; or all (default "
                    "reference); with --sut vllm --exec vllm one hunt: vllm-exec-hang or "
                    "vllm-exec-crash (default both)")
    fz.add_argument("--sut", choices=["harness", "vllm"], default="harness",
                    help="whose decision code the ranks run: the harness's (default) or the "
                    "installed vLLM's (held to the harness's reference by `differential`)")
    fz.add_argument("--exec", dest="execution", choices=["harness", "vllm"], default="harness",
                    help="whose code executes the decided steps: the harness's (default) or "
                    "vLLM's own UBatchRunner, ubatching contexts and graph manager (each rank "
                    "its own process: the sim world hands these to a torchrun world)")
    fz.add_argument("--world", choices=WORLDS, default="sim")
    add_backend_flags(fz)
    fz.add_argument("--nproc", type=int, metavar="N",
                    help="fix the DP size (default: drawn from "
                    f"{', '.join(map(str, SIM_DP_SIZES))} in the sim world, 2 in torchrun)")
    budget = fz.add_argument_group("budget (per variant)")
    budget.add_argument("--examples", type=int, metavar="N", help="world runs at most")
    budget.add_argument("--seconds", type=float, metavar="S",
                        help=f"search time (default {DEFAULT_SECONDS:.0f} s unless --examples)")
    budget.add_argument("--shrink-seconds", type=float, default=30.0, metavar="S",
                        help="shrinking stops after this, keeping the smallest failure so far")
    fz.add_argument("--profile", choices=PROFILES, default=None,
                    help="Hypothesis profile (default: $HYPOTHESIS_PROFILE, else dev)")
    fz.add_argument("--hypothesis-seed", type=int, metavar="N", help="seed the search")
    fz.add_argument("--database", default=DEFAULT_DATABASE, metavar="DIR|URL",
                    help="example database, a directory or redis://host:port/db shared by "
                    "several processes: failures found before are replayed first")
    fz.add_argument("--jobs", type=int, default=1, metavar="N",
                    help="run N fuzz processes (seeds --hypothesis-seed + 0..N-1) sharing "
                    "the database: a failure one finds is replayed by the others")
    fz.add_argument("--no-database", action="store_true", help="start from nothing")
    fz.add_argument("--log", default=DEFAULT_LOG, metavar="FILE",
                    help="run log (JSON lines) for `python -m harness report`")
    fz.add_argument("--found-dir", default=".harness/found", metavar="DIR",
                    help="where shrunk scenarios are saved for replay")
    fz.add_argument("--json", action="store_true", help="print one JSON object per variant")
    fz.add_argument("--progress", action="store_true",
                    help="draw the progress bar even when stderr is not a terminal")
    add_timeout_flags(fz, FUZZ_TIMEOUTS)
    add_config_flags(fz)
    add_vllm_flags(fz, sut_flag=False)
    add_schedule_flags(fz, fuzz=True)
    fz.set_defaults(func=cmd_fuzz)
    return fz


def chosen_variants(args: argparse.Namespace) -> list[Variant]:
    if getattr(args, "execution", "harness") == "vllm":
        return exec_variants(args)
    if args.sut == "harness":
        if args.variant != "all":
            return [variant_named(args.variant)]
        return list(VARIANTS.values())
    if args.variant != "reference":
        raise ConfigError("variant", f"--sut {args.sut} fuzzes that system as it is; "
                          "variants plant bugs in the harness's own code")
    from harness.vllm_sut.available import unavailable_reason, vllm_version

    if vllm_version() is None:
        raise ConfigError("sut", f"vllm cannot be used here: {unavailable_reason()} "
                          "(make test-vllm installs it)")
    return [SUT_VARIANTS[args.sut]]


def fitting_variants(variants: list[Variant], dp_sizes: tuple[int, ...],
                     every: bool) -> list[Variant]:
    """The variants a world of `dp_sizes` can show: under `--variant all` the others are
    skipped, each with its reason; one named alone is bad input (it could never be found)."""
    kept = []
    for variant in variants:
        why = variant.fits(dp_sizes)
        if why is None:
            kept.append(variant)
        elif every:
            print(f"skipped: {why}", flush=True)
        else:
            raise ConfigError("nproc", why)
    return kept


def exec_variants(args: argparse.Namespace) -> list[Variant]:
    """`--exec vllm`: with `--sut vllm` a search for each failure class of vLLM's microbatch
    threads under faults (the reference's draws by default; `all` or a named hunt, its own);
    with the harness's decisions, a fault-free search."""
    hunts = tuple(name for name, variant in EXEC_VARIANTS.items() if variant.hunt)
    if args.variant not in ("reference", "all", *hunts):
        raise ConfigError("variant", "--exec vllm fuzzes vLLM's execution code as it is; "
                          "variants plant bugs in the harness's own code (with --sut vllm "
                          f"one hunt may be named: {', '.join(hunts)})")
    if args.variant in hunts and args.sut != "vllm":
        raise ConfigError("variant", f"{args.variant} hunts vLLM's execution under its own "
                          "decisions: it needs --sut vllm")
    from harness.vllm_sut.available import unavailable_reason, vllm_version

    if vllm_version() is None:
        raise ConfigError("execution", f"vllm cannot be used here: {unavailable_reason()} "
                          "(make test-vllm installs it)")
    if args.sut == "vllm":
        if args.variant == "reference":  # the plain search: the reference's draws, per class
            return [unsteered(EXEC_VARIANTS[name]) for name in EXEC_DEFAULT_HUNTS]
        chosen = EXEC_DEFAULT_HUNTS if args.variant == "all" else (args.variant,)
        return [EXEC_VARIANTS[name] for name in chosen]
    return [EXEC_VARIANTS["vllm-exec"]]


def pinned_fields(args: argparse.Namespace, variants: list[Variant]) -> dict[str, Any]:
    """The config fields the flags fix; validated alone, then with each variant's planted
    bug, so a bad one is reported up front."""
    fields = config_fields_from_args(args)
    if args.nproc is not None:
        fields["dp_size"] = args.nproc
    HarnessConfig.of(**fields)
    for variant in variants:
        _check_pins(variant, fields)
    return fields


def _plain(value: Any) -> Any:
    return getattr(value, "value", value)


def _check_pins(variant: Variant, fields: dict[str, Any]) -> None:
    """The pins must keep the variant's bug and leave some legal config to draw; otherwise
    the search would report on another system, or find no scenario and exit 0."""
    for name, value in variant.changes:
        if name in fields and _plain(fields[name]) != value:
            raise ConfigError(name, f"{fields[name]!r} replaces {value!r}, the bug --variant "
                              f"{variant.name} plants")
    for name, value in variant.undo:
        if name in fields and _plain(fields[name]) == value:
            raise ConfigError(name, f"{value!r} takes out the bug --variant {variant.name} "
                              "plants")
    merged = {**fields, **dict(variant.changes)}
    if "enable_dbo" in fields or "ubatch_size" in fields:
        HarnessConfig.of(**merged)
        return
    first: ConfigError | None = None
    for k in variant.ubatch_counts:  # the fuzzer draws the microbatch count from these
        try:
            HarnessConfig.of(**{**merged, **ubatching_fields(k)})
            return
        except ConfigError as exc:
            first = first or exc
    assert first is not None
    counts = ", ".join(map(str, variant.ubatch_counts))
    raise ConfigError(first.field, f"{first.message} (with each microbatch count --variant "
                      f"{variant.name} draws: {counts})")


def check_search_flags(args: argparse.Namespace) -> None:
    """Where the search writes and how it is seeded, checked before it runs for minutes."""
    output_file("log", args.log)
    output_dir("found_dir", args.found_dir)
    if args.no_database:
        if args.database != DEFAULT_DATABASE:
            raise ConfigError("database", "contradicts --no-database; give one of them")
    elif not is_url(args.database):
        output_dir("database", args.database)
    if not 1 <= args.jobs <= MAX_JOBS:
        raise ConfigError("jobs", f"must be 1 to {MAX_JOBS} processes, got {args.jobs}")
    if args.jobs > 1 and args.no_database:
        raise ConfigError("jobs", "jobs share failures through the database; --no-database "
                          "leaves them nothing to share")
    if args.hypothesis_seed is not None and args.hypothesis_seed < 0:
        # Python's Random ignores the sign: -N would repeat the search of N.
        raise ConfigError("hypothesis_seed", f"must be non-negative, got "
                          f"{args.hypothesis_seed} (seeds N and -N search alike)")


def budget_from_args(args: argparse.Namespace) -> Budget:
    if args.examples is not None and args.examples <= 0:
        raise ConfigError("examples", f"must be positive, got {args.examples}")
    for name in ("seconds", "shrink_seconds"):
        if getattr(args, name) is not None:
            check_seconds(name, getattr(args, name), limit=None)
    seconds = args.seconds
    if seconds is None and args.examples is None:
        seconds = DEFAULT_SECONDS
    return Budget(examples=args.examples, seconds=seconds, shrink_seconds=args.shrink_seconds)


def _world_flags(args: argparse.Namespace) -> str:
    """The flags a replay needs to run on the same kind of world."""
    flags = f"--backend {args.backend}" if args.backend != "gloo" else ""
    return f"{flags} --device {args.device}".strip() if args.device else flags


def cmd_fuzz(args: argparse.Namespace) -> int:
    check_execution_backend(args.execution, args.backend, args.device)
    vllm = vllm_fields(args)  # first: a checkout may be what makes vllm import
    variants = chosen_variants(args)
    fixed = {**pinned_fields(args, variants), **vllm}
    tested = tested_vllm_json(HarnessConfig.of(**vllm)) if vllm else None
    if vllm and not args.json:
        print(tested_vllm(HarnessConfig.of(**vllm)), flush=True)
    budget = budget_from_args(args)
    schedules = space_from_args(args)
    check_search_flags(args)
    timeouts = timeouts_from_args(args)
    database = None if args.no_database else open_database(args.database)
    if args.jobs != 1:
        from harness.fuzz.jobs import run_jobs

        return run_jobs(args, [v.name for v in variants], budget)
    nproc = args.nproc if args.nproc is not None else (None if args.world == "sim" else 2)
    dp_sizes = (nproc,) if nproc is not None else SIM_DP_SIZES
    variants = fitting_variants(variants, dp_sizes, args.variant == "all")
    profile = args.profile or profile_from_environment()
    outcomes = []
    uses_vllm = any(HarnessConfig.of(**{**fixed, **dict(v.changes)}).uses_vllm for v in variants)
    with WorldPool(args.world, args.backend, timeouts, nproc, args.device,
                   preload_vllm=uses_vllm) as pool:
        for variant in variants:
            bar = ProgressBar(f"fuzz {variant.name}", budget.seconds, budget.examples,
                              force=args.progress)
            try:
                outcome = fuzz(variant, pool.run, world=args.world, dp_sizes=dp_sizes,
                               fixed=fixed, budget=budget, profile=profile, database=database,
                               log_path=args.log, scenario_dir=args.found_dir,
                               seed=args.hypothesis_seed, progress=bar.update,
                               hunt=variant.hunt, schedules=schedules,
                               world_flags=f"{_world_flags(args)} {replay_flags(vllm)}".strip())
            finally:
                bar.close()
            outcomes.append(outcome)
            _print_outcome(outcome, variant, args.json, tested)
        leftover = pool.close()
    if leftover:
        print(f"error: processes of the world outlived it: {leftover}", file=sys.stderr)
        return 1
    # Only `all` is a self-check (each planted bug found, the reference clean); the plain
    # search under vLLM's execution runs one search per failure class, judged as any search.
    self_check = args.variant == "all"
    if self_check and not args.json:
        print_table(outcomes)
    if not args.json:
        print_coverage(outcomes)
    return fuzz_exit(outcomes, self_check)


def print_coverage(outcomes: list[FuzzOutcome]) -> None:
    """Each checker's verdicts over every example of every variant searched."""
    examples = sum(o.examples for o in outcomes)
    variants = f" of {len(outcomes)} variants" if len(outcomes) > 1 else ""
    print("\n".join(coverage_lines(merged(o.coverage for o in outcomes),
                                   f"{examples} examples{variants}")))


def fuzz_exit(outcomes: list[FuzzOutcome], several: bool) -> int:
    """A search (or one per failure class): 1 when any found anything. Several (a
    self-check): 0 only when each did its job, every planted bug found as itself and the
    reference clean."""
    if several:
        return 0 if all(did_its_job(o.variant, o.found, o.checker) for o in outcomes) else 1
    return 1 if any(o.found for o in outcomes) else 0


def table_verdict(outcome: FuzzOutcome) -> str:
    """ok; FALSE (the reference failed); MISSED; or "found as X" (a planted bug shown by a
    checker that does not name it: a miss)."""
    if did_its_job(outcome.variant, outcome.found, outcome.checker):
        return "ok"
    if not expects_a_finding(outcome.variant):
        return "FALSE"
    return "MISSED" if not outcome.found else \
        variant_detection(outcome.variant, outcome.found, outcome.checker)


def _print_outcome(outcome: FuzzOutcome, variant: Variant, as_json: bool,
                   tested: dict[str, Any] | None = None) -> None:
    if as_json:
        print(json.dumps({**outcome.to_json_dict(), "vllm": tested}), flush=True)
        return
    head = f"{outcome.variant} on the {outcome.world} world:"
    if not outcome.found:
        print(f"{head} nothing found in {outcome.examples} examples, {outcome.seconds:.1f} s "
              f"({outcome.note})")
    else:
        _print_finding(head, outcome, variant)
    if outcome.set_aside:
        print(f"  {len(outcome.set_aside)} one-off failure(s), a bound running out: set aside")
    if outcome.unconfirmed:
        print(f"  {len(outcome.unconfirmed)} shrunk candidate(s) failed once and passed "
              "their rerun: the smallest that failed twice is reported (see the log)")
    sys.stdout.flush()


def _print_finding(head: str, outcome: FuzzOutcome, variant: Variant) -> None:
    runs = outcome.intermittency
    kind = f", {runs.label}: {runs.detail}," if runs else ""
    done = "found" if runs else "found and shrunk"
    print(f"{head} FOUND by {outcome.checker}{kind} after {outcome.examples_to_detection} "
          f"examples ({outcome.seconds_to_detection:.1f} s); {done} in "
          f"{outcome.seconds:.1f} s, {outcome.examples} examples")
    print(f"  {outcome.detail}")
    shown = detection(variant.caught_by, True, outcome.checker)
    if not variant.is_reference and shown != FOUND:
        print(f"  {shown}: a miss, {variant.name} is named by {', '.join(variant.caught_by)}")
    if runs:
        print(f"  {outcome.note}")
    print(f"  {'scenario' if runs else 'shrunk scenario'}: {describe_scenario(outcome)}")
    print(f"  replay: {outcome.replay}")
    if outcome.blob:
        print(f"  blob: {outcome.blob}")
    print(outcome.scenario.to_json())


def describe_scenario(outcome: FuzzOutcome) -> str:
    scenario = outcome.scenario
    c = scenario.config
    sizes = ",".join(map(str, c.cudagraph_capture_sizes)) or "-"
    steps = " then ".join(str([len(r.query_lens) if all(q == 1 for q in r.query_lens)
                               else list(r.query_lens) for r in ranks])
                          for ranks in scenario.steps)
    faults = "".join(f"; {f.kind.value} on rank {f.rank} step {f.step} microbatch {f.ubatch}"
                     for f in scenario.faults)
    s = c.serving
    return (f"dp {s.dp_size}, k {c.num_ubatches}, {s.cudagraph_mode.name}, capture sizes "
            f"{sizes}, thresholds {s.decode_threshold}/{s.prefill_threshold}, tokens {steps}"
            f"{faults}")


def print_table(outcomes: list[FuzzOutcome]) -> None:
    width = max(24, *(len(o.variant) for o in outcomes))  # names of vLLM's bugs run long
    verdicts = [table_verdict(o) for o in outcomes]
    wide = max(8, *map(len, verdicts))  # "found as CHECKER" runs long
    print(f"\n{'variant':{width}} {'verdict':{wide}} {'checker':22} {'finding':18} "
          f"{'to detection':>14} {'examples':>8} {'seconds':>8}")
    for o, verdict in zip(outcomes, verdicts, strict=True):
        detect = (f"{o.examples_to_detection} / {o.seconds_to_detection:.1f}s" if o.found
                  else "-")
        print(f"{o.variant:{width}} {verdict:{wide}} {o.checker or '-':22} {o.kind or '-':18} "
              f"{detect:>14} {o.examples:>8} {o.seconds:8.1f}")
