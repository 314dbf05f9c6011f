"""`python -m harness check --history FILE`: a run saved by `run --save-history` judged again
by today's checkers, against the references it was judged by, printed as `run` prints it and
with its exit codes. No world starts and no vLLM is needed."""

from __future__ import annotations

import argparse

from harness.check.history_file import load_run
from harness.check.judge import judge
from harness.cli_result import show_result


def cmd_check(args: argparse.Namespace) -> int:
    saved = load_run(args.history)
    return show_result(judge(saved.history, saved.references), saved.tested, args.json)


def add_check_command(sub) -> None:
    check = sub.add_parser("check", help="judge a run saved with `run --save-history` again "
                           "and print every checker's verdict per step")
    check.add_argument("--history", required=True, metavar="FILE",
                       help="the JSON file `run --save-history FILE` wrote")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.set_defaults(func=cmd_check)
