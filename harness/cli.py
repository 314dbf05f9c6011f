"""`python -m harness`: the command line. Bad input is one line on stderr and exit code 2;
what the harness itself cannot do (an unknown vLLM API, a world that would not start, a rank
runtime it could not build, a checker that raised) one line and exit code 3."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NoReturn

from harness.batch import RankBatch, validate_batches
from harness.check.agreement import first_disagreement
from harness.check.history_file import SavedRun, check_writable, save_run
from harness.check.judge import judge
from harness.cli_check import add_check_command
from harness.cli_config import (
    add_config_flags,
    add_timeout_flags,
    config_from_args,
    int_list,
    timeouts_from_args,
)
from harness.cli_result import (
    EXIT_BAD_INPUT,
    EXIT_CANNOT,
    EXIT_FOUND,
    EXIT_OK,
    print_tested,
    show_result,
    tested_of,
)
from harness.cli_schedule import add_schedule_flags, schedule_from_args
from harness.cli_vllm import add_vllm_flags, scenario_with_vllm_code, tested_vllm_json, vllm_fields
from harness.config import HarnessConfig
from harness.config_values import check_seconds
from harness.errors import ConfigError, HarnessCannot, one_line
from harness.exhaustive import explore
from harness.fuzz.command import add_fuzz_command
from harness.history.decision import StepPlan
from harness.reference_plans import references_for
from harness.report.command import add_report_command
from harness.report.matrix_command import add_matrix_command
from harness.scenario import load_scenario
from harness.sut.systems import decide as decide_on_rank
from harness.timeouts import DEFAULT_TIMEOUTS
from harness.world import (
    WORLDS,
    add_backend_flags,
    check_execution_backend,
    open_world,
    world_for,
)
from harness.world.sim.threads import RankFailure, RankHang, ThreadWorld


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see --help)",
              file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def _per_rank(field: str, values: list[int] | None, dp_size: int) -> list[int] | None:
    if values is not None and len(values) != dp_size:
        raise ConfigError(field, f"has {len(values)} entries for {dp_size} ranks (--tokens)")
    return values


def batches_from_args(args: argparse.Namespace) -> list[RankBatch]:
    tokens = int_list("tokens", args.tokens) or []
    if not tokens:
        raise ConfigError("tokens", "needs one count per rank, e.g. --tokens 64,128")
    dp = len(tokens)
    ucts = _per_rank("uct", int_list("uct", args.uct), dp) or [1] * dp
    reqs = _per_rank("reqs", int_list("reqs", args.reqs), dp)
    for rank in args.no_ubatch_rank:
        if not 0 <= rank < dp:
            raise ConfigError("no_ubatch_rank", f"rank {rank} is outside the {dp} ranks")
    batches = []
    for rank, n in enumerate(tokens):
        if n < 0:
            raise ConfigError("tokens", f"rank {rank} has a negative token count {n}")
        if ucts[rank] < 0:
            raise ConfigError("uct", f"rank {rank} has a negative uniform token count")
        uct = ucts[rank] or None
        if reqs is None and uct is not None and n % uct:
            raise ConfigError("uct", f"rank {rank}: {n} tokens are not a multiple of {uct}")
        batches.append(RankBatch.uniform(n, uct, None if reqs is None else reqs[rank],
                                         allow_ubatching=rank not in args.no_ubatch_rank))
    return batches


def _plan_json(plan: StepPlan) -> dict[str, Any]:
    return {
        "rank": plan.rank,
        "cg_mode": plan.desc.cg_mode.name,
        "num_tokens": plan.num_tokens,
        "num_reqs": plan.num_reqs,
        "num_ubatches": plan.desc.num_ubatches,
        "uniform_token_count": plan.uniform_token_count,
        "eager": plan.eager,
        "regions": [{"tokens": r.tokens, "real_tokens": r.real_tokens} for r in plan.regions],
    }


def _plan_table(plans: Sequence[StepPlan]) -> str:
    header = ("rank", "real", "decision", "graph", "tokens", "reqs", "uct", "regions (real/size)")
    rows = [header]
    for p in plans:
        graph = "-" if p.desc.cg_mode.name == "NONE" else p.desc.label()
        regions = " ".join(f"{r.real_tokens}/{r.tokens}" for r in p.regions) or "-"
        rows.append((str(p.rank), str(p.real_tokens), p.kind, graph, str(p.num_tokens),
                     str(p.num_reqs), str(p.uniform_token_count), regions))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def cmd_decide(args: argparse.Namespace) -> int:
    check_seconds("timeout", args.timeout)
    batches = batches_from_args(args)
    config = config_from_args(args, dp_size=len(batches), extra=vllm_fields(args))
    validate_batches(config, batches)
    with ThreadWorld(config.serving.dp_size, timeout_s=args.timeout) as world:
        try:
            plans = world.run(lambda rank, group: decide_on_rank(group, config, rank,
                                                                 batches[rank], args.timeout))
        except (RankFailure, RankHang) as exc:
            return _ranks_failed(exc, config, args.json)
    disagreement = first_disagreement(plans)
    if args.json:
        print(json.dumps({"agree": disagreement is None,
                          "disagreement": disagreement.describe() if disagreement else None,
                          "ranks": [_plan_json(p) for p in plans],
                          "vllm": tested_vllm_json(config)}))
    else:
        _print_tested(config)
        print(_plan_table(plans))
        print("ranks agree" if disagreement is None
              else f"RANKS DISAGREE: {disagreement.describe()}")
    return EXIT_OK if disagreement is None else EXIT_FOUND


def _ranks_failed(exc: RankFailure | RankHang, config: HarnessConfig, as_json: bool) -> int:
    """A rank that raised or hung is the decision's finding: one verdict line, exit 1. One
    that raised HarnessCannot is the harness's own failure (exit 3)."""
    if isinstance(exc, RankFailure):
        cannot = [e for e in exc.errors.values() if isinstance(e, HarnessCannot)]
        if cannot:
            raise cannot[0]
        rank, error = next(iter(exc.errors.items()))
        others = f" (ranks {sorted(exc.errors)} failed)" if len(exc.errors) > 1 else ""
        line = f"rank {rank} failed: {one_line(error)}{others}"
    else:
        line = str(exc)
    if as_json:
        print(json.dumps({"agree": False, "failed": line, "disagreement": None, "ranks": [],
                          "vllm": tested_vllm_json(config)}))
    else:
        _print_tested(config)
        print(f"RANKS FAILED: {line}")
    return EXIT_FOUND


def _print_tested(config: HarnessConfig, note: str = "") -> None:
    print_tested(tested_of(config, note))


def cmd_run(args: argparse.Namespace) -> int:
    scenario, note = scenario_with_vllm_code(load_scenario(args.scenario), args)
    scenario = replace(scenario, schedule=schedule_from_args(args, scenario.schedule))
    timeouts = timeouts_from_args(args)
    check_execution_backend(scenario.config.system.execution.value, args.backend, args.device)
    if args.save_history:
        check_writable(args.save_history)
    world = open_world(world_for(args.world, scenario.config), scenario.config.serving.dp_size,
                       args.backend, timeouts, args.device,
                       preload_vllm=scenario.config.uses_vllm)
    try:
        history = world.run(scenario)
        references = tuple(references_for(history.scenario))
        result = judge(history, references)
    finally:
        leftover = world.close()
    if leftover:
        print(f"error: processes of the world outlived it: {leftover}", file=sys.stderr)
    tested = tested_of(scenario.config, note)
    code = show_result(result, tested, args.json)
    if args.save_history:  # after the verdicts, so a file that cannot be written loses none
        save_run(args.save_history, SavedRun(history, references, tested))
    return code


DEFAULT_MAX_TOKENS = 512
# Beyond this an enumeration takes the better part of a day (20k-40k rank decisions a second).
MAX_RANK_DECISIONS = 10**9


def _rank_decisions(config: HarnessConfig, max_tokens: int) -> int:
    """How many rank decisions `explore` makes: one per rank of every visited vector."""
    counts, dp = max_tokens + 1, config.serving.dp_size
    vectors = counts**dp if config.mutation.threshold_offset_rank is not None else math.comb(
        counts + dp - 1, dp)
    return vectors * dp


def _max_tokens(config: HarnessConfig, max_tokens: int | None) -> int:
    """The token bound to enumerate up to; one too large to finish is bad input."""
    largest = min(config.serving.max_num_reqs, config.serving.max_num_batched_tokens)
    if max_tokens is None:
        max_tokens = min(DEFAULT_MAX_TOKENS, largest)
    if _rank_decisions(config, 1) > MAX_RANK_DECISIONS:
        raise ConfigError("nproc", f"{config.serving.dp_size} ranks make more than "
                          f"{MAX_RANK_DECISIONS:.0e} rank decisions even up to 1 token")
    tokens = max_tokens
    if not 1 <= tokens <= largest or _rank_decisions(config, tokens) <= MAX_RANK_DECISIONS:
        return max_tokens  # `explore` refuses a bound outside what a batch may hold
    low, high = 1, tokens  # the largest count that fits, by bisection
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if _rank_decisions(config, mid) <= MAX_RANK_DECISIONS \
            else (low, mid - 1)
    raise ConfigError("max_tokens", f"{tokens} on {config.serving.dp_size} ranks makes "
                      f"{_rank_decisions(config, tokens):,} rank decisions; at most {low} "
                      f"keeps within the {MAX_RANK_DECISIONS:.0e} (most of a day) the "
                      "enumeration is bounded by")


def cmd_exhaustive(args: argparse.Namespace) -> int:
    config = config_from_args(args, dp_size=args.nproc, extra=vllm_fields(args))
    max_tokens = _max_tokens(config, args.max_tokens)
    start = time.perf_counter()
    result = explore(config, max_tokens)
    seconds = time.perf_counter() - start
    found = [{"checker": c.checker, "tokens": list(c.tokens), "detail": c.detail}
             for c in result.counterexamples]
    if args.json:
        print(json.dumps({"found": bool(found), "vectors": result.vectors,
                          "max_tokens": result.max_tokens, "seconds": round(seconds, 3),
                          "counterexamples": found, "vllm": tested_vllm_json(config)}))
    else:
        _print_tested(config)
        print(f"{result.vectors} token vectors of {config.serving.dp_size} ranks up to "
              f"{result.max_tokens} tokens in {seconds:.1f} s")
        for c in found:
            print(f"  {c['checker']}: tokens {c['tokens']}: {c['detail']}")
        print("no structural invariant broken" if not found else
              f"replay one with `python -m harness decide --tokens "
              f"{','.join(map(str, found[0]['tokens']))}` and the same config flags")
    return EXIT_FOUND if found else EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="python -m harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)
    decide = sub.add_parser("decide", help="run one step's DP sync on every rank and show the "
                            "decision each rank gets")
    decide.add_argument("--tokens", required=True, metavar="N,N",
                        help="scheduled tokens per rank; its length is dp_size")
    decide.add_argument("--uct", metavar="U,U",
                        help="uniform token count per rank (1 = uniform decode, the default; "
                        "0 = mixed batch)")
    decide.add_argument("--reqs", metavar="R,R", help="requests per rank (default tokens / uct)")
    decide.add_argument("--no-ubatch-rank", type=int, action="append", default=[], metavar="R",
                        help="a rank that does not allow microbatching (repeatable)")
    decide.add_argument("--timeout", type=float, default=10.0, metavar="S",
                        help="bound on each collective, seconds")
    decide.add_argument("--json", action="store_true", help="print one JSON object")
    add_config_flags(decide)
    add_vllm_flags(decide, differential=False)
    decide.set_defaults(func=cmd_decide)

    run = sub.add_parser("run", help="run a scenario on a world and print every checker's "
                         "verdict per step")
    run.add_argument("--scenario", required=True, metavar="FILE", help="JSON or TOML scenario")
    run.add_argument("--world", choices=WORLDS, default="sim",
                     help="sim: ranks as threads of this process with real gloo groups; "
                     "torchrun: one process per rank, launched by torchrun")
    add_backend_flags(run)
    run.add_argument("--json", action="store_true", help="print one JSON object")
    add_timeout_flags(run, DEFAULT_TIMEOUTS)
    add_vllm_flags(run, sut_flag=False)
    add_schedule_flags(run)
    run.add_argument("--save-history", metavar="OUT.json",
                     help="also write the run's whole history and references to this file, "
                     "for `python -m harness check --history` to judge again")
    run.set_defaults(func=cmd_run)
    add_check_command(sub)

    exhaustive = sub.add_parser("exhaustive", help="every uniform-decode token vector of a "
                                "small world through the decision layer and structural checkers")
    exhaustive.add_argument("--nproc", type=int, default=2, metavar="N", help="DP size")
    exhaustive.add_argument("--max-tokens", type=int, metavar="N",
                            help=f"largest token count per rank (default {DEFAULT_MAX_TOKENS}, "
                            "or fewer when max_num_reqs or max_num_batched_tokens allow fewer)")
    exhaustive.add_argument("--json", action="store_true", help="print one JSON object")
    add_config_flags(exhaustive)
    add_vllm_flags(exhaustive, differential=False)
    exhaustive.set_defaults(func=cmd_exhaustive)
    add_fuzz_command(sub)
    add_report_command(sub)
    add_matrix_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except HarnessCannot as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CANNOT
    except (RankFailure, RankHang) as exc:
        print(f"error: the ranks did not complete the step: {exc}", file=sys.stderr)
        return EXIT_FOUND
