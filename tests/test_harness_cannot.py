"""When the harness itself fails (a scenario its sandbox runner cannot read, a rank runtime it
cannot build, a checker that raises) the command exits 3 with one line naming what: never a
traceback, never a finding of the system under test (exit 1), which a real crash still is."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import record_builders as rb

from harness import reference_plans
from harness.check import registry
from harness.check.history_file import SavedRun, save_run
from harness.cli import EXIT_CANNOT, EXIT_FOUND, EXIT_OK, main
from harness.errors import ConfigError, HarnessCannot, cannot_of, one_line
from harness.fuzz.jobs import JobResult, campaign_exit
from harness.history.scenario_history import ScenarioHistory
from harness.invariants import CheckerName
from harness.scenario import scenario_from_dict
from harness.timeouts import Timeouts
from harness.world.channel.messages import SimRun
from harness.world.sandbox import world as sandbox_world
from harness.world.sandbox.world import SandboxedSimWorld
from harness.world.sim import world as sim_world
from harness.world.sim.world import SimWorld

ROOT = Path(__file__).resolve().parents[1]
FAST = Timeouts(collective_s=1.0, hang_s=2.0, step_deadline_s=5.0)
FAST_FLAGS = ("--collective-timeout", "1", "--hang-timeout", "2", "--deadline", "5")
SMALL = {"capture_sizes": [16, 32], "max_num_reqs": 32, "max_num_batched_tokens": 64,
         "decode_threshold": 8, "prefill_threshold": 16}
CLEAN = {"name": "clean", "config": SMALL, "steps": [{"ranks": [20, 21]}]}


def scenario_file(tmp_path: Path, document: dict) -> Path:
    path = tmp_path / f"{document['name']}.json"
    path.write_text(json.dumps(document))
    return path


def one_error_line(err: str) -> str:
    """The command's whole stderr, which must be one line and no traceback."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def raising(name: CheckerName, calls: list | None = None):
    """The registry with checker `name` replaced by one that raises, as a checker's bug would
    (each call noted in `calls`)."""
    def boom(inputs):
        if calls is not None:
            calls.append(inputs)
        raise KeyError("rank 7")
    return tuple(replace(c, judge=boom) if c.name is name else c for c in registry.REGISTRY)


def test_a_harness_failure_reads_as_one_line_with_the_rest_kept_as_detail():
    cannot = HarnessCannot("world", "the runner could not start\nits log", "Traceback ...")
    assert str(cannot) == "world: the runner could not start"
    assert cannot.detail == "its log\nTraceback ..."
    assert one_line(ValueError("bad\nmore")) == "ValueError: bad"
    wrapped = cannot_of(ConfigError("steps", "must be a list"), "world", "reading it")
    assert str(wrapped) == "world: reading it: ConfigError: steps: must be a list"
    assert cannot_of(cannot, "other", "doing").what == "world"  # keeps what it names


def test_a_checker_that_raises_is_exit_3_naming_it_not_a_verdict(capsys, tmp_path, monkeypatch):
    scenario = scenario_from_dict(CLEAN)
    history = ScenarioHistory(scenario, FAST, tuple(rb.startup_records(2)),
                              (tuple(rb.step_records(2)),))
    saved = tmp_path / "run.json"
    save_run(saved, SavedRun(history, (rb.reference(2),)))
    monkeypatch.setattr(registry, "REGISTRY", raising(CheckerName.AGREEMENT))
    assert main(["check", "--history", str(saved)]) == EXIT_CANNOT
    out, err = capsys.readouterr()
    assert one_error_line(err) == "error: checker agreement: raised KeyError: 'rank 7'"
    assert "FAIL" not in out


def short_fuzz(tmp_path):
    """A 20-example reference search saving what it finds under tmp_path/found: (that
    directory, the exit code)."""
    found = tmp_path / "found"
    code = main(["fuzz", "--variant", "reference", "--nproc", "2", "--examples", "20",
                 "--hypothesis-seed", "0", "--no-database", "--log", str(tmp_path / "log"),
                 "--found-dir", str(found), *FAST_FLAGS])
    return found, code


def test_a_checker_that_raises_under_the_fuzzer_ends_the_search_with_exit_3_unshrunk(
        capsys, tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(registry, "REGISTRY", raising(CheckerName.ERRORS, calls))
    found, code = short_fuzz(tmp_path)
    out, err = capsys.readouterr()
    assert code == EXIT_CANNOT, out
    assert one_error_line(err) == "error: checker errors: raised KeyError: 'rank 7'"
    assert len(calls) == 1  # not taken for a failure to shrink and replay
    assert not found.exists() or not list(found.iterdir())  # no finding saved


def reference_raising(monkeypatch, calls: list | None = None) -> None:
    """The single-process reference raising, as a bug in it (or in the code making the plans
    another system is held to) would, each call noted in `calls`."""
    def boom(scenario, to_match=None):
        if calls is not None:
            calls.append(scenario)
        raise IndexError("step 3 of 1\nits detail")
    monkeypatch.setattr(reference_plans, "reference_rows", boom)


def test_a_reference_that_raises_is_exit_3_in_one_line_not_a_traceback(capsys, tmp_path,
                                                                       monkeypatch):
    reference_raising(monkeypatch)
    code = main(["run", "--scenario", str(scenario_file(tmp_path, CLEAN)), *FAST_FLAGS])
    out, err = capsys.readouterr()
    assert code == EXIT_CANNOT, out
    assert one_error_line(err) == ("error: reference: computing the expected rows and plans "
                                   "raised: IndexError: step 3 of 1")
    assert "FAIL" not in out


def test_a_reference_that_raises_under_the_fuzzer_ends_the_search_with_exit_3_unshrunk(
        capsys, tmp_path, monkeypatch):
    calls: list = []
    reference_raising(monkeypatch, calls)
    found, code = short_fuzz(tmp_path)
    out, err = capsys.readouterr()
    assert code == EXIT_CANNOT, out
    assert one_error_line(err).startswith("error: reference: computing the expected rows")
    assert len(calls) == 1  # not taken for a failure to shrink and replay
    assert not found.exists() or not list(found.iterdir())


def test_a_campaign_whose_job_could_not_do_its_part_exits_3_and_bad_input_still_2(tmp_path):
    def job(index: int, code: int) -> JobResult:
        clean = {"variant": "reference", "found": False, "checker": None}
        return JobResult(index, index, code, (clean,) if code == 0 else (), tmp_path / "log",
                         "error: world: rank 0 could not build its runtime: ...",
                         tmp_path / "err", ())
    assert campaign_exit([job(1, 0), job(2, 3)], ["reference"]) == EXIT_CANNOT
    assert campaign_exit([job(1, 2), job(2, 3)], ["reference"]) == 2
    assert campaign_exit([job(1, 0), job(2, 0)], ["reference"]) == EXIT_OK


def test_a_rank_runtime_that_cannot_be_built_is_the_harness_s_failure_naming_the_rank(
        monkeypatch):
    built = sim_world.RankRuntime

    def refusing(config, rank, *args, **kwargs):
        if rank == 1:  # as vLLM's configs refuse a config the harness accepted
            raise ConfigError("max_num_reqs", "vLLM rejects it: too few for the graphs")
        return built(config, rank, *args, **kwargs)

    monkeypatch.setattr(sim_world, "RankRuntime", refusing)
    with SimWorld(2, FAST) as world, pytest.raises(HarnessCannot) as raised:
        world.run(scenario_from_dict(CLEAN))
    assert str(raised.value) == ("world: rank 1 could not build its runtime: ConfigError: "
                                 "max_num_reqs: vLLM rejects it: too few for the graphs")


def unreadable(scenario: dict) -> SimRun:
    """What the driver sends, broken the way a runner of another harness would read it."""
    return SimRun({**scenario, "steps": "no steps"})


def test_a_scenario_the_sandbox_runner_cannot_read_is_exit_3_in_one_line_not_a_crash(
        capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox_world, "SimRun", unreadable)
    code = main(["run", "--scenario", str(scenario_file(tmp_path, CLEAN)), *FAST_FLAGS])
    out, err = capsys.readouterr()
    assert code == EXIT_CANNOT, out
    line = one_error_line(err)
    assert line.startswith("error: world: the sim world's runner could not read the scenario "
                           "it was sent: ConfigError: steps"), line
    assert "RankCrashed" not in out and "FAIL" not in out


def test_after_the_runner_could_not_read_a_scenario_the_next_one_runs_on_a_fresh_runner(
        monkeypatch):
    with SandboxedSimWorld(2, FAST) as world:
        with monkeypatch.context() as patched:
            patched.setattr(sandbox_world, "SimRun", unreadable)
            with pytest.raises(HarnessCannot, match="could not read the scenario"):
                world.run(scenario_from_dict(CLEAN))
        launches = world.launches
        history = world.run(scenario_from_dict(CLEAN))
        assert world.launches == launches + 1
        assert all(r is not None and r.error is None for r in history.steps[0])


def test_a_rank_that_truly_crashes_is_still_a_finding_exit_1(capsys):
    # A size-mismatched all-to-all: gloo aborts the runner (SIGABRT, now and then a
    # segfault in the abort), the system's own crash.
    code = main(["run", "--scenario", str(ROOT / "scenarios" / "a2a-unpadded-sizes.json"),
                 *FAST_FLAGS])
    out, err = capsys.readouterr()
    assert code == EXIT_FOUND, err
    assert "RankCrashed" in out and re.search(r"fatal signal \((SIGABRT|SIGSEGV)", out)
    assert "error:" not in err


def test_the_same_clean_run_exits_0(capsys, tmp_path):
    assert main(["run", "--scenario", str(scenario_file(tmp_path, CLEAN)),
                 *FAST_FLAGS]) == EXIT_OK
