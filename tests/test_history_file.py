"""A run's history as data: `run --save-history` writes every record, reference and config the
checkers read, and `check --history` judges that file again with the verdicts and exit code
the run gave. An edited record is judged on what it now says; a bad file is one line."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import typing
from pathlib import Path
from typing import Any

import pytest
import record_builders as rb
from hypothesis import given
from hypothesis import strategies as st

from harness.check.history_file import VERSION, SavedRun, load_run, save_run
from harness.check.reference import ReferenceRows, reference_rows
from harness.cli import EXIT_BAD_INPUT, EXIT_FOUND, EXIT_OK, main
from harness.history.codec import decode, encode
from harness.history.decision import descriptor_of_label
from harness.history.records import StartupRecord, StepRecord
from harness.scenario import scenario_from_dict
from harness.timeouts import Timeouts
from harness.world.sim.world import SimWorld

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
SMALL = {"capture_sizes": [16, 32], "max_num_reqs": 32, "max_num_batched_tokens": 64,
         "decode_threshold": 8, "prefill_threshold": 16}
CLEAN = {"name": "clean", "config": SMALL, "steps": [{"ranks": [20, 24]},
                                                     {"ranks": [{"query_lens": [2, 3]}, 9]}]}
# Microbatch 0 of rank 0 raises in eager step 0: records with errors, a world that stops there.
FAULTED = {**CLEAN, "name": "faulted", "config": {**SMALL, "cudagraph_mode": "NONE"},
           "faults": [{"kind": "raise_in_ubatch", "rank": 0, "step": 0, "ubatch": 0}]}
FAST = Timeouts(collective_s=1.0, hang_s=2.0, step_deadline_s=5.0)
FAST_FLAGS = ("--collective-timeout", "1", "--hang-timeout", "2", "--deadline", "5")


def scenario_file(tmp_path: Path, document: dict) -> Path:
    path = tmp_path / f"{document['name']}.json"
    path.write_text(json.dumps(document))
    return path


def run_and_check(capsys, scenario: Path, saved: Path, *flags: str) -> tuple:
    """(exit code, output) of `run --save-history`, then of `check` over what it saved."""
    ran = main(["run", "--scenario", str(scenario), "--save-history", str(saved), *flags,
                *FAST_FLAGS])
    run_out = capsys.readouterr().out
    checked = main(["check", "--history", str(saved), *flags])
    return (ran, run_out), (checked, capsys.readouterr().out)


@pytest.mark.parametrize("flags", [(), ("--json",)], ids=["text", "json"])
@pytest.mark.parametrize("document", [CLEAN, FAULTED], ids=["clean", "faulted"])
def test_a_saved_run_judged_again_prints_what_the_run_printed(capsys, tmp_path, document, flags):
    ran, checked = run_and_check(capsys, scenario_file(tmp_path, document),
                                 tmp_path / "out.json", *flags)
    assert checked == ran and ran[0] == EXIT_OK


def test_a_failing_regression_scenario_judged_again_fails_the_same_checkers(capsys, tmp_path):
    ran, checked = run_and_check(capsys, SCENARIOS / "guard-equality.json",
                                 tmp_path / "out.json")
    assert checked == ran and ran[0] == EXIT_FOUND
    assert "FAIL no_empty_region: rank 0 (16 real tokens)" in checked[1]


def test_a_saved_run_reads_back_equal_to_the_history_the_world_handed_back(tmp_path):
    # One run, saved by the writer `run --save-history` calls: two runs of a faulted step may
    # differ in what a timed-out peer last saw, so only the same history is compared.
    saved = tmp_path / "out.json"
    with SimWorld(2, FAST) as world:
        history = world.run(scenario_from_dict(FAULTED))
    save_run(saved, SavedRun(history, tuple(reference_rows(history.scenario))))
    loaded = load_run(saved).history
    assert len(loaded.steps) == 1 and all(r.error is not None for r in loaded.steps[0])
    assert loaded.scenario == history.scenario and loaded.timeouts == history.timeouts
    assert loaded.startup == history.startup
    assert loaded.steps == history.steps
    assert (loaded.evidence, loaded.batched) == (history.evidence, history.batched)


def test_an_edited_row_of_one_rank_is_judged_a_mismatch_with_the_reference(capsys, tmp_path):
    saved = tmp_path / "out.json"
    assert main(["run", "--scenario", str(scenario_file(tmp_path, CLEAN)),
                 "--save-history", str(saved)]) == EXIT_OK
    data = json.loads(saved.read_text())
    data["steps"][0][1]["outputs"][3][0] += 0.5  # rank 1's fourth real row
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["check", "--history", str(saved)]) == EXIT_OK
    capsys.readouterr()
    assert main(["check", "--history", str(edited), "--json"]) == EXIT_FOUND
    out = json.loads(capsys.readouterr().out)
    failed = {v["checker"]: v["detail"] for v in out["steps"][0]["verdicts"] if not v["ok"]}
    assert set(failed) == {"matches_reference"}
    assert "rank 1" in failed["matches_reference"]


def _graphs(data: dict) -> list[dict]:
    return [g for rank in data["startup"] for g in rank["graphs"]]


def _check_json(capsys, path: Path) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["check", "--history", str(path), "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_reach_is_judged_again_from_the_saved_graphs_not_from_the_ranks_own_claim(
        capsys, tmp_path, saved_text):
    data = json.loads(saved_text)
    twins = [g for g in _graphs(data) if g["num_ubatches"] > 1]
    assert twins and all(g["reached_by"] is not None for g in twins)
    for graph in _graphs(data):
        graph["reached_by"] = None  # every rank now claims no batch reaches its graphs
    disowned = tmp_path / "disowned.json"
    disowned.write_text(json.dumps(data))
    assert _check_json(capsys, disowned)[0] == EXIT_OK
    # Rank 1's twin now takes two tokens a request (no decode here has more than one); it
    # still claims the batch that reached it before.
    claimed = next(g for g in data["startup"][1]["graphs"] if g["num_ubatches"] > 1)
    twin = descriptor_of_label(claimed["label"])
    wider = dataclasses.replace(twin, num_reqs=twin.num_tokens // 2, uniform_token_count=2)
    claimed.update(label=wider.label(), reached_by=twin.num_tokens)
    relabelled = tmp_path / "relabelled.json"
    relabelled.write_text(json.dumps(data))
    code, out = _check_json(capsys, relabelled)
    failed = {v["checker"]: v["detail"] for v in out["startup"] if not v["ok"]}
    assert code == EXIT_FOUND and set(failed) == {"graphs_reachable"}
    assert failed["graphs_reachable"].startswith("rank 1: 1 graph(s) no legal batch can replay")


@pytest.fixture(scope="module")
def saved_text(tmp_path_factory) -> str:
    """The text of a clean run's saved history, for the bad-input tests to spoil."""
    directory = tmp_path_factory.mktemp("saved")
    saved = directory / "out.json"
    assert main(["run", "--scenario", str(scenario_file(directory, CLEAN)),
                 "--save-history", str(saved), "--json"]) == EXIT_OK
    return saved.read_text()


def _spoiled(text: str, change) -> str:
    data = json.loads(text)
    change(data)
    return json.dumps(data)


SPOILS = {
    "truncated": (lambda text: text[:len(text) // 2], "is not valid JSON"),
    "garbage": (lambda text: "\x00not json at all", "is not valid JSON"),
    "a scenario": (lambda text: json.dumps(CLEAN), "format is not 'harness-history'"),
    "wrong version": (lambda text: _spoiled(text, lambda d: d.update(version=VERSION + 1)),
                      f"version is {VERSION + 1}; this harness reads version {VERSION}"),
    "a row of text": (lambda text: _spoiled(
        text, lambda d: d["steps"][0][0].update(outputs=[["x"]])),
        "steps[0][0].outputs[0][0] must be a number, got 'x'"),
    "a rank short": (lambda text: _spoiled(text, lambda d: d["steps"][0].pop()),
                     "steps[0] has 1 records for 2 ranks"),
    "an unknown field": (lambda text: _spoiled(
        text, lambda d: d["startup"][0].update(colour="red")),
        "startup[0].colour is not a field of StartupRecord"),
}


@pytest.mark.parametrize("spoil", sorted(SPOILS))
def test_a_bad_history_file_is_one_line_naming_the_file_and_exit_2(capsys, tmp_path, saved_text,
                                                                 spoil):
    change, said = SPOILS[spoil]
    path = tmp_path / "spoiled.json"
    path.write_text(change(saved_text))
    capsys.readouterr()
    assert main(["check", "--history", str(path)]) == EXIT_BAD_INPUT
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert captured.out == "" and len(err) == 1
    assert err[0].startswith(f"error: history: {path}") and said in err[0]


def test_a_history_that_cannot_be_written_is_refused_before_the_run(capsys, tmp_path):
    missing = tmp_path / "no-such-folder" / "out.json"
    assert main(["run", "--scenario", str(scenario_file(tmp_path, CLEAN)),
                 "--save-history", str(missing)]) == EXIT_BAD_INPUT
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: save_history: ")


def values(hint: Any) -> st.SearchStrategy:
    """Any value of a record's type hint (floats finite, so that equality is defined)."""
    args = typing.get_args(hint)
    if type(None) in args:
        (arm,) = [a for a in args if a is not type(None)]
        return st.none() | values(arm)
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return st.builds(hint, **{f.name: values(hints[f.name])
                                  for f in dataclasses.fields(hint) if f.init})
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return st.sampled_from(hint)
    if typing.get_origin(hint) is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(values(args[0]), max_size=3).map(tuple)
        return st.tuples(*map(values, args))
    leaves = {float: st.floats(allow_nan=False), int: st.integers(), str: st.text(max_size=8),
              bool: st.booleans()}
    return leaves[hint]


def through_json(value: Any, hint: Any) -> Any:
    return decode(json.loads(json.dumps(encode(value, hint), allow_nan=False)), hint)


@given(values(StepRecord))
def test_a_step_record_reads_back_equal_from_its_json(record):
    assert StepRecord.from_dict(json.loads(json.dumps(record.to_dict(), allow_nan=False))) \
        == record


@given(values(StartupRecord), values(ReferenceRows))
def test_start_up_records_and_references_read_back_equal_from_their_json(startup, reference):
    assert through_json(startup, StartupRecord) == startup
    assert through_json(reference, ReferenceRows) == reference


def test_the_builders_records_read_back_equal_and_keep_their_rows():
    for record in rb.step_records(3):
        data = record.to_dict()
        assert [tuple(row) for row in data["outputs"]] == list(rb.ROWS)
        assert StepRecord.from_dict(data) == record
    assert through_json(rb.reference(3, tuple(rb.plans(3))), ReferenceRows) == rb.reference(
        3, tuple(rb.plans(3)))


def test_a_row_that_is_not_a_number_reads_back_as_one():
    record = dataclasses.replace(rb.step_records(2)[0],
                                 outputs=((math.nan, math.inf), (-math.inf, 0.0)))
    again = through_json(record, StepRecord)
    assert math.isnan(again.outputs[0][0])
    assert again.outputs[0][1:] == (math.inf,) and again.outputs[1] == (-math.inf, 0.0)
