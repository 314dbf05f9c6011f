"""`python -m harness.campaign`: `make fuzz-campaign`.

    python -m harness.campaign --jobs N [--database URL] [--log FILE] [--out DIR] [FUZZ FLAGS]

Runs `python -m harness fuzz --jobs N` against the database given, or against a Redis server
it starts on a free loopback port for the campaign and stops at its end, then turns the
merged run log into one report. The remaining flags go to `fuzz` as they are. Exit: the fuzz
command's status, or 2 on bad input (one line naming the field).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator, Sequence

from harness.campaign.redis_server import LocalRedis
from harness.cli import EXIT_BAD_INPUT
from harness.cli import main as harness_main
from harness.errors import ConfigError
from harness.fuzz.run_log import DEFAULT_LOG


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.campaign", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=2, metavar="N", help="fuzz processes (2)")
    p.add_argument("--database", metavar="URL|DIR",
                   help="the shared example database (default: a Redis server started here)")
    p.add_argument("--log", default=DEFAULT_LOG, metavar="FILE",
                   help=f"the merged run log, appended to (default {DEFAULT_LOG})")
    p.add_argument("--out", default="report", metavar="DIR", help="the report (report/)")
    return p


@contextlib.contextmanager
def _database(given: str | None) -> Iterator[str]:
    if given is not None:
        yield given
        return
    with LocalRedis() as endpoint:
        print(f"campaign: Redis server on {endpoint.url()} for this campaign", flush=True)
        yield endpoint.url()


def main(argv: Sequence[str]) -> int:
    args, fuzz_flags = parser().parse_known_args(argv)
    if "--no-database" in fuzz_flags or "--jobs" in fuzz_flags:
        print("error: campaign: --no-database and --jobs are the campaign's own to set",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        with _database(args.database) as url:
            code = harness_main(["fuzz", "--jobs", str(args.jobs), "--database", url,
                                 "--log", args.log, *fuzz_flags])
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if code == EXIT_BAD_INPUT:
        return code
    report = harness_main(["report", "--log", args.log, "--out", args.out])
    return code if report != EXIT_BAD_INPUT else report
