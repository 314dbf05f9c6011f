"""Where a distributed suite's time went: each test's seconds summed by what it is for, and
the worlds' life cycles (starts, relaunches, ends, soft regroups). Printed at the end of
`make test-dp`; the tests are told apart by the name of their function."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# (prefix of the test function's name, the row it counts under), first match wins.
KINDS = (
    ("test_the_fuzzer_finds_each_planted_bug", "detection searches (one per planted bug)"),
    ("test_the_fuzzer_finds_nothing", "the fuzzer's reference search"),
    ("test_every_checker_holds_on_skewed", "the Hypothesis pass over DP skew"),
    ("test_each_regression_scenario", "regression scenarios, each buggy and undone"),
)
OTHER = "other tests (faults, channel, life cycle)"


def kind_of(nodeid: str) -> str:
    function = nodeid.split("::")[-1].split("[")[0]
    return next((row for prefix, row in KINDS if function.startswith(prefix)), OTHER)


def add_test(totals: dict[str, list[float]], nodeid: str, phase: str, seconds: float) -> None:
    """One phase of a test (set-up, call, teardown): its seconds count, its call the test."""
    row = totals.setdefault(kind_of(nodeid), [0, 0.0])
    row[0] += phase == "call"
    row[1] += seconds


def add_clock(totals: dict[str, list[float]], clock_totals: Mapping[str, Iterable]) -> None:
    """A world's `LifecycleClock.totals()`, summed over the session's worlds."""
    for event, (count, seconds) in clock_totals.items():
        row = totals.setdefault(event, [0, 0.0])
        row[0] += count
        row[1] += seconds


def time_table(tests: Mapping[str, list[float]], worlds: Mapping[str, list[float]],
               wall_s: float, workers: int) -> list[str]:
    """Shares are of the tests' seconds summed (over `workers` pytest workers at once)."""
    total = sum(seconds for _, seconds in tests.values())
    lines = [f"{'where the time went':48} {'count':>5} {'seconds':>8} {'share':>6}"]
    for row in [row for _, row in KINDS] + [OTHER]:
        if row in tests:
            count, seconds = tests[row]
            lines.append(f"{row:48} {count:5d} {seconds:8.1f} {_share(seconds, total):>6}")
    if worlds:
        lines.append("of which the worlds' life cycles (inside the tests above):")
        for event, (count, seconds) in worlds.items():
            lines.append(f"  {event:46} {count:5d} {seconds:8.1f} {_share(seconds, total):>6}")
    lines.append(f"tests' seconds summed: {total:.1f} over {workers} worker(s); wall time of "
                 f"the session: {wall_s:.1f} s")
    return lines


def _share(seconds: float, total: float) -> str:
    return f"{100 * seconds / total:5.0f}%" if total > 0 else "-"
