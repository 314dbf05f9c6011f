"""`--schedule`, `--schedule-seed` and `--preemptions` (`run`, `fuzz`): how the microbatch
threads of every rank interleave (docs/schedules.md). A bad value is one line naming the
flag (exit 2)."""

from __future__ import annotations

import argparse

from harness.errors import ConfigError
from harness.runtime.schedule.descriptor import MODES, OS_SCHEDULE, Schedule

# A descriptor field's error, named by the flag that set it.
_FLAGS = {"schedule.mode": "schedule", "schedule.seed": "schedule_seed",
          "schedule.preemptions": "preemptions"}


def add_schedule_flags(parser: argparse.ArgumentParser, fuzz: bool = False) -> None:
    g = parser.add_argument_group("schedule of each rank's microbatch threads "
                                  "(docs/schedules.md)")
    given = ("the fuzzer draws it per example (shrinking toward 0) unless given" if fuzz
             else "default: the scenario's, else 0")
    g.add_argument("--schedule", choices=MODES, default=None,
                   help="os: the operating system decides (the default, as before); random, "
                   "pct, exhaustive: one thread runs at a time and the schedule picks the "
                   "next at every handoff, so a run replays exactly and a hang is reported "
                   "at once" + ("" if fuzz else " (default: the scenario's, else os)"))
    g.add_argument("--schedule-seed", type=int, metavar="N",
                   help="seed of random and pct; with exhaustive, the number of the schedule "
                   f"(0 never preempts); {given}")
    g.add_argument("--preemptions", type=int, metavar="N",
                   help=f"exhaustive: at most N preemptions per microbatch run (default "
                   f"{Schedule.preemptions})")


def schedule_from_args(args: argparse.Namespace, base: Schedule = OS_SCHEDULE) -> Schedule:
    """The schedule the flags make of `base` (a scenario's): a flag given wins, and a mode
    other than `base`'s starts from that mode's defaults."""
    mode = args.schedule or base.mode
    if args.schedule_seed is not None and mode == "os":
        raise ConfigError("schedule_seed", "needs a controlled --schedule (random, pct or "
                          "exhaustive); under os the operating system decides")
    if args.preemptions is not None and mode != "exhaustive":
        raise ConfigError("preemptions", f"bounds --schedule exhaustive only, not {mode}")
    start = base if mode == base.mode else Schedule(mode)
    seed = start.seed if args.schedule_seed is None else args.schedule_seed
    preemptions = start.preemptions if args.preemptions is None else args.preemptions
    try:
        return Schedule(mode, seed=seed, depth=start.depth, preemptions=preemptions,
                        steps=start.steps)
    except ConfigError as exc:
        raise ConfigError(_FLAGS.get(exc.field, exc.field), exc.message) from None
