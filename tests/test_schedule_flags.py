"""`--schedule`, `--schedule-seed` and `--preemptions` on `run` and `fuzz`
(harness/cli_schedule.py): a bad value is one line naming the flag and exit 2; the flags win
over a scenario's schedule, field by field; `run --scenario` runs the file's schedule."""

from __future__ import annotations

import argparse
import json

import pytest

from harness.cli import main
from harness.cli_result import EXIT_BAD_INPUT, EXIT_OK
from harness.cli_schedule import schedule_from_args
from harness.errors import ConfigError
from harness.runtime.schedule import OS_SCHEDULE, Schedule

SCENARIO = {"config": {"cudagraph_mode": "NONE", "max_num_reqs": 16,
                       "max_num_batched_tokens": 32, "decode_threshold": 4,
                       "prefill_threshold": 16},
            "steps": [{"ranks": [{"tokens": 10}, {"tokens": 12}]}]}


def flags(schedule=None, seed=None, preemptions=None) -> argparse.Namespace:
    return argparse.Namespace(schedule=schedule, schedule_seed=seed, preemptions=preemptions)


@pytest.fixture
def scenario_file(tmp_path):
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps({**SCENARIO, "schedule": {"mode": "pct", "seed": 4}}))
    return str(path)


@pytest.mark.parametrize("command", ["run", "fuzz"])
@pytest.mark.parametrize("bad, flag", [
    (["--schedule-seed", "-1", "--schedule", "pct"], "schedule_seed"),
    (["--schedule", "os", "--schedule-seed", "3"], "schedule_seed"),
    (["--schedule", "pct", "--preemptions", "1"], "preemptions"),
    (["--schedule", "exhaustive", "--preemptions", "-2"], "preemptions"),
    (["--schedule", "exhaustive", "--preemptions", "1", "--schedule-seed", "101"],
     "schedule_seed"),
])
def test_a_bad_schedule_flag_is_one_line_naming_it_and_exit_2(command, bad, flag, capsys,
                                                              tmp_path, scenario_file):
    args = (["run", "--scenario", scenario_file] if command == "run"
            else ["fuzz", "--no-database", "--examples", "1", "--log", str(tmp_path / "log"),
                  "--found-dir", str(tmp_path / "found")])
    assert main([*args, *bad]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {flag}:") and "\n" not in err


@pytest.mark.parametrize("command", ["run", "fuzz"])
def test_an_unknown_schedule_mode_is_refused_by_the_parser_in_one_line(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--scenario", "x.json", "--schedule", "fair"] if command == "run"
             else [command, "--schedule", "fair"])
    assert info.value.code == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert "--schedule" in err and "'fair'" in err and "\n" not in err


def test_without_flags_the_scenarios_schedule_stands():
    mine = Schedule("pct", seed=4, depth=2, steps=40)
    assert schedule_from_args(flags(), mine) == mine
    assert schedule_from_args(flags()) == OS_SCHEDULE


def test_a_flag_replaces_its_field_and_another_mode_starts_from_its_defaults():
    mine = Schedule("pct", seed=4, depth=2, steps=40)
    assert schedule_from_args(flags(seed=9), mine) == Schedule("pct", seed=9, depth=2, steps=40)
    assert schedule_from_args(flags("random"), mine) == Schedule("random")
    assert schedule_from_args(flags("os"), mine) == OS_SCHEDULE
    assert schedule_from_args(flags("exhaustive", 3, 1)) == Schedule(
        "exhaustive", seed=3, preemptions=1)


def test_a_seed_for_a_scenario_under_os_names_the_flag():
    with pytest.raises(ConfigError) as info:
        schedule_from_args(flags(seed=1))
    assert info.value.field == "schedule_seed"


def test_run_replays_the_schedule_of_the_scenario_file_and_os_records_no_choices(
        scenario_file, tmp_path, capsys):
    choices = []
    for extra in ([], [], ["--schedule", "os"]):
        history = tmp_path / "history.json"
        code = main(["run", "--scenario", scenario_file, "--json",
                     "--save-history", str(history), *extra])
        assert code == EXIT_OK, capsys.readouterr().out[-2000:]
        saved = json.loads(history.read_text())
        choices.append([r["schedule_choices"] for step in saved["steps"] for r in step])
    assert choices[0] == choices[1] and all(c for c in choices[0])
    assert choices[2] == [None, None]
