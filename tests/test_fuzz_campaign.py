"""Fuzz runs that share failures through one example database: a directory or a Redis server
(a real one, started here on a free port), `fuzz --jobs N` and `python -m harness.campaign`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis.database import ExampleDatabase, InMemoryExampleDatabase

from harness.campaign.redis_server import LocalRedis, free_loopback_port, redis_server_binary
from harness.cli import EXIT_BAD_INPUT, EXIT_FOUND, main
from harness.errors import ConfigError
from harness.fuzz.database import parse_redis_url
from harness.fuzz.engine import FUZZ_TIMEOUTS, Budget, database_key, fuzz
from harness.fuzz.run_log import ExampleEntry, FindingEntry, read_log
from harness.fuzz.variants import variant_named
from harness.world.sim.world import SimWorld

ROOT = Path(__file__).resolve().parents[1]
VARIANT = variant_named("guard-merged")
SEARCH = ["--variant", "guard-merged", "--nproc", "2", "--world", "sim", "--shrink-seconds",
          "3"]


def _no_redis_reason() -> str | None:
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the redis package is not installed (pip install -e '.[dev]' installs it)"
    if redis_server_binary() is None:
        return "redis-server is not installed and could not be (make redis installs it)"
    return None


needs_redis = pytest.mark.skipif(_no_redis_reason() is not None,
                                 reason=_no_redis_reason() or "")


@pytest.fixture(scope="module")
def redis_server():
    with LocalRedis() as endpoint:
        yield endpoint


@pytest.mark.parametrize("url, says", [
    ("redis://127.0.0.1:notaport/0", "not a redis:// URL"),
    ("ftp://127.0.0.1:21/0", "scheme 'ftp'"),
    ("redis://:secret@127.0.0.1:6379/0", "credentials"),
    ("redis://127.0.0.1:6379/zero", "must be a number"),
    ("redis:///0", "names no host"),
])
def test_a_bad_database_url_is_one_line_naming_the_field(url, says, capsys, tmp_path):
    with pytest.raises(ConfigError) as exc:
        parse_redis_url(url)
    assert exc.value.field == "database" and says in exc.value.message
    code = main(["fuzz", "--database", url, "--log", str(tmp_path / "log"), *SEARCH])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_BAD_INPUT and len(err) == 1 and "database" in err[0], err
    assert "secret" not in err[0]


@needs_redis
def test_a_redis_server_that_does_not_answer_is_refused_before_any_search(capsys, tmp_path):
    code = main(["fuzz", "--database", f"redis://127.0.0.1:{free_loopback_port()}/0",
                 "--log", str(tmp_path / "log"), *SEARCH])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_BAD_INPUT and len(err) == 1 and "no Redis server answers" in err[0]
    assert not (tmp_path / "log").exists()


@pytest.mark.parametrize("flags, field", [
    (["--jobs", "0"], "jobs"),
    (["--jobs", "2", "--no-database"], "jobs"),
])
def test_jobs_that_cannot_share_are_refused(flags, field, capsys, tmp_path):
    code = main(["fuzz", "--log", str(tmp_path / "log"), *SEARCH, *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_BAD_INPUT and len(err) == 1 and f"{field}:" in err[0], err


def _fuzz_json(capsys, tmp_path: Path, database: str, seed: int, log: str) -> dict:
    code = main(["fuzz", "--json", "--database", database, "--hypothesis-seed", str(seed),
                 "--seconds", "40", "--log", str(tmp_path / log), "--found-dir",
                 str(tmp_path / "found"), *SEARCH])
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert code == EXIT_FOUND, out
    return out


@needs_redis
@pytest.mark.timeout(240)
def test_a_failure_job_one_found_is_replayed_by_job_two_from_redis_with_no_search(
        redis_server, capsys, tmp_path):
    # Job 2 searching alone (its own empty database) must search to find the bug ...
    alone = _fuzz_json(capsys, tmp_path, redis_server.url(1), seed=2, log="alone.jsonl")
    assert (alone["found_by"], alone["replayed"]) == ("search", 0)
    # ... and after job 1 found it in the shared database, it runs the saved failure first.
    job1 = _fuzz_json(capsys, tmp_path, redis_server.url(0), seed=1, log="job1.jsonl")
    assert job1["found_by"] == "search"
    job2 = _fuzz_json(capsys, tmp_path, redis_server.url(0), seed=2, log="job2.jsonl")
    assert job2["found_by"] == "replay" and job2["replayed"] >= 1
    # Its first scenario failed (two world runs: the run and the rerun that confirms it).
    assert job2["examples_to_detection"] == 2
    assert job2["checker"] == job1["checker"] == "no_empty_region"
    first = next(e for e in read_log(tmp_path / "job2.jsonl") if isinstance(e, ExampleEntry))
    assert not first.ok
    finding = next(e for e in read_log(tmp_path / "job2.jsonl") if isinstance(e, FindingEntry))
    assert finding.found_by == "replay"


def test_a_running_search_restarts_on_a_failure_another_process_saved(tmp_path):
    """The other process is played by copying a found failure into this search's database
    at its third world run; the search must restart and replay it at once."""
    theirs, ours = InMemoryExampleDatabase(), InMemoryExampleDatabase()
    key = database_key(VARIANT, {"dp_size": 2}, (2,))
    budget = Budget(examples=None, seconds=60, shrink_seconds=2)
    with SimWorld(2, FUZZ_TIMEOUTS) as world:
        found = fuzz(VARIANT, world.run, world="sim", dp_sizes=(2,), fixed={"dp_size": 2},
                     budget=budget, database=theirs, seed=1, scenario_dir=tmp_path)
        assert found.found and list(theirs.fetch(key))
        runs = []

        def run(scenario):
            runs.append(scenario)
            if len(runs) == 3:
                for value in theirs.fetch(key):
                    ours.save(key, value)
            return world.run(scenario)

        shared = fuzz(VARIANT, run, world="sim", dp_sizes=(2,), fixed={"dp_size": 2},
                      budget=budget, database=ours, seed=2, scenario_dir=tmp_path)
    assert shared.found and shared.restarts == 1 and shared.found_by == "replay"
    # Found on the first world run after the save: runs 1-3 passed, run 4 and its rerun fail.
    assert shared.examples_to_detection == 5


class _Recording(ExampleDatabase):
    """A database that notes every key it was asked to read or write."""

    def __init__(self, inner: ExampleDatabase) -> None:
        super().__init__()
        self.inner, self.read, self.written = inner, set(), set()

    def fetch(self, key: bytes):
        self.read.add(key)
        return self.inner.fetch(key)

    def save(self, key: bytes, value: bytes) -> None:
        self.written.add(key)
        self.inner.save(key, value)

    def delete(self, key: bytes, value: bytes) -> None:
        self.inner.delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.written.add(dest)
        self.inner.move(src, dest, value)


def test_two_variants_keep_their_examples_apart_in_one_shared_database(tmp_path):
    # One Hypothesis test serves every variant: unkeyed, the second would replay the first's.
    shared, other, fixed = _Recording(InMemoryExampleDatabase()), variant_named("reference"), \
        {"dp_size": 2}
    with SimWorld(2, FUZZ_TIMEOUTS) as world:
        found = fuzz(VARIANT, world.run, world="sim", dp_sizes=(2,), fixed=fixed,
                     budget=Budget(seconds=60, shrink_seconds=2), database=shared, seed=1,
                     scenario_dir=tmp_path)
        written, shared.read = set(shared.written), set()
        second = fuzz(other, world.run, world="sim", dp_sizes=(2,), fixed=fixed,
                      budget=Budget(examples=3, seconds=None), database=shared, seed=1,
                      scenario_dir=tmp_path)
    ours, theirs = database_key(VARIANT, fixed, (2,)), database_key(other, fixed, (2,))
    assert found.found and written and all(k.startswith(ours) for k in written), written
    assert shared.read and all(k.startswith(theirs) for k in shared.read), shared.read
    assert second.replayed == 0 and second.found_by != "replay"


def _run_to_first_failure(log: Path) -> list[dict]:
    examples = [e for e in read_log(log) if isinstance(e, ExampleEntry)]
    first = next(i for i, e in enumerate(examples) if not e.ok)
    return [e.scenario for e in examples[:first + 1]]


def test_a_seeded_search_is_reproducible_and_still_reads_and_writes_the_shared_database(
        tmp_path):
    shared, fresh = InMemoryExampleDatabase(), InMemoryExampleDatabase()
    key = database_key(VARIANT, {"dp_size": 2}, (2,))
    with SimWorld(2, FUZZ_TIMEOUTS) as world:
        def search(database: InMemoryExampleDatabase, log: str):
            return fuzz(VARIANT, world.run, world="sim", dp_sizes=(2,), fixed={"dp_size": 2},
                        budget=Budget(seconds=60, shrink_seconds=2), database=database,
                        seed=3, log_path=tmp_path / log, scenario_dir=tmp_path)

        first, again, rerun = (search(shared, "first"), search(fresh, "again"),
                               search(shared, "rerun"))
    # Same seed, empty databases: the same scenarios, in order, up to the same failure.
    assert first.found_by == again.found_by == "search"
    assert _run_to_first_failure(tmp_path / "first") == _run_to_first_failure(tmp_path / "again")
    # The seeded search saved its failure there, and the seeded rerun replays it first.
    assert list(shared.fetch(key))
    assert rerun.found_by == "replay" and rerun.examples_to_detection == 2


def _subprocess_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}


@needs_redis
@pytest.mark.timeout(240)
def test_a_campaign_starts_redis_runs_two_jobs_and_merges_their_logs_into_one_report(tmp_path):
    log, out = tmp_path / "campaign.jsonl", tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.campaign", "--jobs", "2", "--log", str(log), "--out",
         str(out), *SEARCH, "--seconds", "40", "--hypothesis-seed", "1", "--found-dir",
         str(tmp_path / "found")],
        capture_output=True, text=True, timeout=220, env=_subprocess_env(), cwd=tmp_path)
    assert proc.returncode == EXIT_FOUND, proc.stdout + proc.stderr
    url = next(line.split()[4] for line in proc.stdout.splitlines()
               if line.startswith("campaign: Redis server on"))
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    jobs = [row for row in map(str.split, proc.stdout.splitlines())
            if len(row) > 3 and row[2] == "guard-merged"]
    assert [(j[0], j[2], j[3]) for j in jobs] == [("1", "guard-merged", "FOUND"),
                                                  ("2", "guard-merged", "FOUND")], proc.stdout
    entries = list(read_log(log))
    findings = [e for e in entries if isinstance(e, FindingEntry)]
    assert len(findings) == 2 and len({e.run for e in entries}) == 2
    assert (out / "junit.xml").exists() and "2 findings: 2 pass" in proc.stdout
    # The server is gone: nothing answers on its port any more.
    from harness.campaign.redis_server import _answers_ping
    assert not _answers_ping(port)
