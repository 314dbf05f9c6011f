"""Command-line flags that fix config fields, shared by every command that builds a config."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from harness.config import (
    HarnessConfig,
    config_kwargs,
    load_config_file,
    ubatching_fields,
)
from harness.config_values import check_seconds
from harness.errors import ConfigError
from harness.timeouts import Timeouts


def int_list(field: str, text: str | None) -> list[int] | None:
    if text is None:
        return None
    if not text.strip():
        return []
    try:
        # Every entry counts: "1,,2" is a typo, not the list [1, 2].
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigError(field, f"{text!r} is not a comma-separated list of integers") from None


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Flags that fix config fields; shared by every command that builds a config."""
    g = parser.add_argument_group("config (flags override --config FILE)")
    g.add_argument("--config", metavar="FILE", help="JSON or TOML file of config fields")
    g.add_argument("--capture-sizes", metavar="N,N", help="explicit CUDA graph capture sizes")
    g.add_argument("--num-ubatches", type=int, metavar="K",
                   help="microbatches per step: 2 is DBO (default), K > 2 is --ubatch-size K")
    g.add_argument("--no-ubatching", action="store_true", help="turn microbatching off")
    g.add_argument("--decode-threshold", type=int, metavar="N")
    g.add_argument("--prefill-threshold", type=int, metavar="N")
    g.add_argument("--mode", metavar="MODE",
                   help="NONE, PIECEWISE, FULL, FULL_DECODE_ONLY or FULL_AND_PIECEWISE")
    g.add_argument("--max-num-reqs", type=int, metavar="N")
    g.add_argument("--max-num-batched-tokens", type=int, metavar="N")
    g.add_argument("--guard", metavar="VARIANT",
                   help="fixed (default), merged or strict-k2 (staged: old spelling of --staging)")
    g.add_argument("--staging", action="store_true", default=None,
                   help="real-token staging where the guard falls back to eager (spec §3.4)")
    g.add_argument("--twins", metavar="VARIANT", help="all (default) or reachable")
    g.add_argument("--threshold-offset-rank", type=int, metavar="R",
                   help="fault: rank R generates twins with a shifted decode threshold")
    g.add_argument("--threshold-offset", type=int, metavar="N")
    g.add_argument("--seed", type=int)


def config_from_args(args: argparse.Namespace, dp_size: int | None = None,
                     extra: dict[str, Any] | None = None) -> HarnessConfig:
    fields = {**config_fields_from_args(args), **(extra or {})}
    if dp_size is not None:
        fields.setdefault("dp_size", dp_size)
    config = HarnessConfig.of(**fields)
    # The offset is a fault on one rank: either flag alone would be silently inert.
    if args.threshold_offset not in (None, 0) and config.mutation.threshold_offset_rank is None:
        raise ConfigError("threshold_offset", "needs --threshold-offset-rank R, the rank it "
                          "shifts")
    if args.threshold_offset_rank is not None and config.mutation.threshold_offset == 0:
        raise ConfigError("threshold_offset_rank", "shifts nothing without a non-zero "
                          "--threshold-offset N")
    return config


def config_fields_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Only the config fields the user gave (file, then flags), unvalidated."""
    fields: dict[str, Any] = (config_kwargs(load_config_file(args.config))
                              if args.config is not None else {})
    flag_fields = {
        "decode_threshold": args.decode_threshold,
        "prefill_threshold": args.prefill_threshold,
        "cudagraph_mode": args.mode,
        "max_num_reqs": args.max_num_reqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "guard": args.guard,
        "staging": args.staging,
        "twins": args.twins,
        "threshold_offset_rank": args.threshold_offset_rank,
        "threshold_offset": args.threshold_offset,
        "seed": args.seed,
        "capture_sizes": int_list("capture_sizes", args.capture_sizes),
    }
    fields.update({k: v for k, v in flag_fields.items() if v is not None})
    if args.num_ubatches is not None:
        if args.no_ubatching:
            raise ConfigError("num_ubatches", "contradicts --no-ubatching; give one of them")
        fields.update(ubatching_fields(args.num_ubatches))
    if args.no_ubatching:
        fields.update(enable_dbo=False, ubatch_size=0)
    return fields


def add_timeout_flags(parser: argparse.ArgumentParser, defaults: Timeouts) -> None:
    g = parser.add_argument_group("bounds on every wait, seconds")
    g.add_argument("--collective-timeout", type=float, default=defaults.collective_s,
                   metavar="S", help="bound on every collective")
    g.add_argument("--hang-timeout", type=float, default=defaults.hang_s, metavar="S",
                   help="a microbatch waiting this long for its turn is a hang (must exceed "
                   "the collective timeout)")
    g.add_argument("--deadline", type=float, default=defaults.step_deadline_s, metavar="S",
                   help="bound on one step of one rank")


def timeouts_from_args(args: argparse.Namespace) -> Timeouts:
    return Timeouts(collective_s=check_seconds("collective_timeout", args.collective_timeout),
                    hang_s=check_seconds("hang_timeout", args.hang_timeout),
                    step_deadline_s=check_seconds("deadline", args.deadline))


def _creatable(field: str, path: Path, directory: Path) -> None:
    """`directory` (where `path` goes) can be made: its nearest existing ancestor is a
    writable directory."""
    try:
        base = next(p for p in (directory, *directory.parents) if p.exists())
    except OSError as exc:  # e.g. a parent that may not be searched
        raise ConfigError(field, f"{path}: {exc.strerror}") from None
    if not base.is_dir():
        where = "" if base == path else f"{path}: "
        raise ConfigError(field, f"{where}{base} is a file, not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ConfigError(field, f"{path}: {base} is not writable")


def output_dir(field: str, text: str) -> Path:
    """A directory the command will write into (made if missing); checked before any work."""
    if not text.strip():
        raise ConfigError(field, "is an empty path; give a directory")
    path = Path(text)
    _creatable(field, path, path)
    return path


def output_file(field: str, text: str) -> Path:
    """A file the command will append to (its directory made if missing)."""
    path = Path(text)  # "" is the current directory, refused below
    if path.is_dir():
        raise ConfigError(field, f"{path} is a directory, not a file")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(field, f"{path} is not writable")
    if not path.exists():
        _creatable(field, path, path.parent)
    return path
