"""One job of `fuzz --jobs N`: the fuzz command with the flags its parent wrote to a file.

    python -m harness.fuzz.job SPEC.json

The file holds the parent's parsed flags (plain JSON values); the parent wrote it itself, so
nothing here comes from a peer.
"""

from __future__ import annotations

import argparse
import json
import sys

from harness.errors import ConfigError, HarnessCannot
from harness.fuzz.command import cmd_fuzz


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m harness.fuzz.job SPEC.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        fields = json.load(f)
    try:
        return cmd_fuzz(argparse.Namespace(**fields))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except HarnessCannot as exc:  # the parent's campaign exits 3 with this line
        print(f"error: {exc}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
