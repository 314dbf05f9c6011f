"""pytest plugin of the harness: options, markers, the world fixture, Hypothesis profiles,
and a summary table of every scenario a world ran."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import settings

from harness.errors import ConfigError
from harness.fuzz.profiles import profile_from_environment
from harness.runtime.intra_op import one_intra_op_thread
from harness.world import BACKEND_HELP, BACKENDS, DEVICE_HELP, DEVICES

settings.load_profile(profile_from_environment())
one_intra_op_thread()  # each pytest worker judges on one core; xdist runs two of them

_SUMMARY: list[tuple[str, int, int, bool, str, float]] = []
_TEST_TIME: dict[str, list] = {}  # harness/report/suite_time.py: the closing time table
_LIFECYCLE: dict[str, list] = {}
_SESSION_START = time.monotonic()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness")
    group.addoption("--nproc", type=int, default=2,
                    help="ranks in the DP world of the distributed suite (default 2)")
    group.addoption("--world", choices=["sim", "torchrun"], default="sim",
                    help="sim: thread ranks in this process; torchrun: rank processes")
    group.addoption("--backend", choices=BACKENDS, default="gloo", help=BACKEND_HELP)
    group.addoption("--device", choices=DEVICES, default=None, help=DEVICE_HELP)
    group.addoption("--nnodes", type=int, default=1,
                    help="torchrun world over this many nodes of --nproc ranks each (c10d "
                    "rendezvous); without --rdzv-endpoint every node runs here on loopback")
    group.addoption("--node-rank", type=int, default=0, help="this node's rank (0: the driver)")
    group.addoption("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                    help="the rendezvous of a multi-node world that spans machines")


def pytest_configure(config: pytest.Config) -> None:
    nproc = config.getoption("--nproc")
    if nproc < 2:
        raise pytest.UsageError(f"--nproc: {nproc} ranks; a DP world needs at least 2")
    config.stash[_WORLD_LINE] = _asked_world_can_run(config)
    if config.getoption("--nnodes") > 1:
        _multi_node_can_run(config)
    _required_vllm_imports()


def _required_vllm_imports() -> None:
    """`make test-vllm` asks for a vLLM release (HARNESS_REQUIRE_VLLM): where that release
    does not import, its tests would all skip, so the run stops instead."""
    required = os.environ.get("HARNESS_REQUIRE_VLLM")
    if not required:
        return
    from harness.vllm_sut.available import unavailable_reason, vllm_version

    found = vllm_version()
    if found != required:
        why = unavailable_reason() or f"vllm {found} imports instead"
        raise pytest.UsageError(f"HARNESS_REQUIRE_VLLM: vllm {required} was asked for: {why}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `starts_first` move to the front, in their own order: pytest-xdist hands
    each worker a contiguous share and steals from its end, so a long test left at the end
    of a share runs alone while the other worker idles. Only the order changes."""
    items.sort(key=lambda item: item.get_closest_marker("starts_first") is None)


def _multi_node_can_run(config: pytest.Config) -> None:
    from harness.world.multinode.nodes import node_spec

    if config.getoption("--world") != "torchrun":
        raise pytest.UsageError("--nnodes: a multi-node world is a torchrun world; add "
                                "--world torchrun")
    endpoint = config.getoption("--rdzv-endpoint")
    try:
        node_spec(config.getoption("--nnodes"), config.getoption("--node-rank"),
                  endpoint or "127.0.0.1:1")
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    if config.getoption("--node-rank") != 0:
        raise pytest.UsageError("--node-rank: the driver (pytest) runs on node 0; other nodes "
                                "run `python -m harness.world.node`")


_WORLD_LINE = pytest.StashKey[str]()  # how the asked-for world runs, for pytest's header


def _asked_world_can_run(config: pytest.Config) -> str:
    """A world that was asked for and cannot run here ends the session with one line: a
    suite that skipped what it was asked to run must not pass. Returns the layout line."""
    from harness.world.torchrun.backends import check_backend

    world = config.getoption("--world")
    backend, device = config.getoption("--backend"), config.getoption("--device")
    if backend == "gloo" and device in (None, "cpu"):
        return ""
    if world != "torchrun":
        raise pytest.UsageError(f"--world {world}: runs gloo on the CPU only; --backend "
                                f"{backend} --device {device} needs --world torchrun")
    try:
        layout = check_backend(backend, config.getoption("--nproc"), device)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    return layout.describe() if layout is not None else f"gloo on {device}, emulated graphs"


def pytest_report_header(config: pytest.Config) -> list[str]:
    line = config.stash.get(_WORLD_LINE, "")
    return [f"harness world: {line}"] if line else []


@pytest.fixture(scope="session")
def nproc(request: pytest.FixtureRequest) -> int:
    """The DP size: --nproc ranks on each of --nnodes nodes."""
    return request.config.getoption("--nproc") * request.config.getoption("--nnodes")


class _SummarisedWorld:
    """The session's world, noting every scenario it runs for the closing table."""

    def __init__(self, world) -> None:
        self.inner = world
        self.nproc = world.nproc
        self.graphs = world.graphs

    def run(self, scenario):
        """The world's history of `scenario`, as the world hands it back."""
        return self._run_and_judge(scenario)[0]

    def judged(self, scenario):
        """`scenario` run on the world and through the checkers."""
        return self._run_and_judge(scenario)[1]

    def _run_and_judge(self, scenario):
        # Judged once, for the closing table and for whoever asked for the verdicts.
        from harness.check.judge import judge

        start = time.monotonic()
        history = self.inner.run(scenario)
        seconds = time.monotonic() - start
        result = judge(history)
        failed = sorted({v.checker for _, v in result.failed_verdicts()})
        _SUMMARY.append((scenario.name, scenario.config.serving.dp_size, len(result.steps),
                         result.ok, ", ".join(failed), seconds))
        return history, result


def _session_world(request: pytest.FixtureRequest, nproc: int, timeouts):
    from harness.world import open_world

    if request.config.getoption("--nnodes") > 1:
        return _multi_node_world(request.config, timeouts)
    # What cannot run here ended the session in pytest_configure, before any test.
    return open_world(request.config.getoption("--world"), nproc,
                      request.config.getoption("--backend"), timeouts,
                      request.config.getoption("--device"))


_MULTI_NODE = pytest.StashKey[object]()


class _WithTimeouts:
    """The session's one multi-node world (its nodes serve one world at a time), run with
    the bounds of the fixture that asked for it."""

    def __init__(self, world, timeouts) -> None:
        self.world, self.timeouts = world, timeouts
        self.nproc, self.graphs = world.nproc, world.graphs

    def run(self, scenario):
        self.world.timeouts = self.timeouts
        return self.world.run(scenario)

    def close(self) -> list[int]:
        return self.world.close()


def _multi_node_world(config: pytest.Config, timeouts):
    if _MULTI_NODE not in config.stash:
        config.stash[_MULTI_NODE] = _new_multi_node_world(config, timeouts)
    return _WithTimeouts(config.stash[_MULTI_NODE], timeouts)


def _new_multi_node_world(config: pytest.Config, timeouts):
    """Every node on loopback when no rendezvous is given (the test starts the other
    agents), else this node's agent joining the others at --rdzv-endpoint."""
    nnodes, per_node = config.getoption("--nnodes"), config.getoption("--nproc")
    endpoint = config.getoption("--rdzv-endpoint")
    if endpoint is None:
        from harness.world.multinode.loopback import loopback_multi_node_world

        return loopback_multi_node_world(nnodes, per_node, timeouts)
    from harness.world.multinode.nodes import node_spec
    from harness.world.multinode.world import multi_node_world

    return multi_node_world(node_spec(nnodes, 0, endpoint), per_node, "gloo", timeouts)


@pytest.fixture(scope="session")
def world(request: pytest.FixtureRequest, nproc: int):
    """One world per session (per xdist worker): built once, rebuilt by itself on failure."""
    from harness.timeouts import DEFAULT_TIMEOUTS

    inner = _session_world(request, nproc, DEFAULT_TIMEOUTS)
    yield _SummarisedWorld(inner)
    _close_and_clock(inner)


@pytest.fixture(scope="session")
def fuzz_world(request: pytest.FixtureRequest, nproc: int):
    """The session's kind of world with the fuzzer's short timeouts (hangs cost seconds)."""
    from harness.fuzz.engine import FUZZ_TIMEOUTS

    inner = _session_world(request, nproc, FUZZ_TIMEOUTS)
    yield inner
    _close_and_clock(inner)


@pytest.fixture(scope="session")
def vllm_exec_pool():
    """Torchrun worlds whose ranks import vLLM before they say ready, with the fuzzer's
    timeouts, kept for the session (per xdist worker): the searches of vLLM's execution share
    them instead of each booting a world and a spare with vLLM's imports (10-60 s apiece)."""
    from harness.fuzz.engine import FUZZ_TIMEOUTS
    from harness.world.pool import WorldPool

    pool = WorldPool("torchrun", "gloo", FUZZ_TIMEOUTS, 2, preload_vllm=True)
    yield pool
    leftover = pool.close()
    assert not leftover, f"processes of the vLLM worlds outlived them: {leftover}"


def _close_and_clock(world) -> None:
    from harness.report.suite_time import add_clock

    leftover = world.close()
    clock = getattr(world, "clock", None)  # worlds of rank processes keep one
    if clock is not None:
        add_clock(_LIFECYCLE, clock.totals())
    assert not leftover, f"processes of the world outlived it: {leftover}"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    from harness.report.suite_time import add_test

    add_test(_TEST_TIME, report.nodeid, report.when, report.duration)


def pytest_sessionfinish(session: pytest.Session) -> None:
    # An xdist worker hands its scenarios and worlds' clocks to the controller's table.
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["harness_summary"] = [list(row) for row in _SUMMARY]
        output["harness_lifecycle"] = _LIFECYCLE


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    from harness.report.suite_time import add_clock

    output = getattr(node, "workeroutput", {})
    _SUMMARY.extend(tuple(row) for row in output.get("harness_summary", ()))
    add_clock(_LIFECYCLE, output.get("harness_lifecycle", {}))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _SUMMARY:
        return
    world = config.getoption("--world")
    tr = terminalreporter
    tr.section(f"scenarios run on the {world} world")
    tr.write_line(f"{'scenario':34} {'ranks':>5} {'steps':>5} {'verdict':8} {'seconds':>7}  "
                  "failing checkers")
    for name, ranks, steps, runs, ok, failed, seconds in _by_name(_SUMMARY):
        label = name if runs == 1 else f"{name} x{runs}"  # a Hypothesis pass is one row
        tr.write_line(f"{label[:34]:34} {ranks:>5} {steps:>5} {'ok' if ok else 'FAIL':8} "
                      f"{seconds:7.2f}  {failed}")
    passed = sum(1 for row in _SUMMARY if row[3])
    tr.write_line(f"{len(_SUMMARY)} scenarios: {passed} held every checker, "
                  f"{len(_SUMMARY) - passed} were caught by one")
    _print_time_table(tr, config)


def _print_time_table(tr, config: pytest.Config) -> None:
    from harness.report.suite_time import time_table

    workers = config.getoption("numprocesses", None) or 1
    tr.section("where the time went")
    for line in time_table(_TEST_TIME, _LIFECYCLE, time.monotonic() - _SESSION_START,
                           workers):
        tr.write_line(line)


def _by_name(rows):
    """The draws of a Hypothesis pass (named `fuzz-...`) merged into one row: the runs, every
    verdict held, the checkers that failed in any, the seconds summed. Other rows as run."""
    merged: dict[object, list] = {}
    for i, (name, ranks, steps, ok, failed, seconds) in enumerate(rows):
        key = (name, ranks) if name.startswith("fuzz-") else i
        if key not in merged:
            merged[key] = [name, ranks, steps, 0, True, set(), 0.0]
        row = merged[key]
        row[2] = max(row[2], steps)
        row[3] += 1
        row[4] = row[4] and ok
        row[5].update(filter(None, failed.split(", ")))
        row[6] += seconds
    return [(*row[:5], ", ".join(sorted(row[5])), row[6]) for row in merged.values()]

