"""The detection table's rows: every planted bug, the stream-order slips under vLLM's
execution among them, each on its own setting; where vllm does not import those rows say so,
and `--variants` picks them like any other. Each bug in two columns, side by side: its own
steered search, and the reference's search (`--detection-column`). No world and no clock:
the fuzz is stood in for."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import harness.bench.detection as detection
import harness.vllm_sut.available as available
from harness.bench.detection import (
    COLUMNS,
    KNOWN_FIXES,
    STEERED,
    UNSTEERED,
    VLLM_ROWS,
    VLLM_SHIPPED,
    VLLM_SLIPS,
    DetectionRow,
    detection_rows,
    known_fixes,
    print_detection,
    timed_variants,
)
from harness.config import Release
from harness.fuzz.unsteered import REFERENCE, unsteered
from harness.fuzz.variants import EXEC_VARIANTS, VARIANTS, reference_for


class FakePool:
    """Records how it was opened and what it ran; runs nothing."""

    opened: list[dict] = []

    def __init__(self, kind, backend, timeouts, nproc=None, device=None, preload_vllm=False):
        self.ran: list = []
        FakePool.opened.append({"kind": kind, "nproc": nproc, "preload_vllm": preload_vllm,
                                "pool": self})

    def run(self, scenario):
        self.ran.append(scenario)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return None


# Per seed, the checker a stand-in search reports instead of the variant's own.
OTHER_CHECKER: dict[int, str] = {}


@pytest.fixture
def fake_search(monkeypatch):
    """Stands in for the worlds and the fuzz: each search 'finds' at 2 s, example 3, by the
    variant's first checker (or by OTHER_CHECKER's for its seed)."""
    FakePool.opened = []
    OTHER_CHECKER.clear()
    searches = []

    def fuzz(variant, run, **kwargs):
        pool = run.__self__
        searches.append({"variant": variant, "pool": pool, "warmed": len(pool.ran), **kwargs})
        checker = OTHER_CHECKER.get(kwargs["seed"], variant.caught_by[0])
        (Path(kwargs["scenario_dir"]) / "found.json").write_text("{}")  # as a finding is
        return SimpleNamespace(found=True, checker=checker, seconds_to_detection=2.0,
                               examples_to_detection=3)

    monkeypatch.setattr(detection, "WorldPool", FakePool)
    monkeypatch.setattr(detection, "fuzz", fuzz)
    return searches


def _without_vllm(monkeypatch):
    monkeypatch.setattr(available, "vllm_version", lambda: None)
    monkeypatch.setattr(available, "unavailable_reason",
                        lambda: "vllm does not import: ModuleNotFoundError: No module named "
                        "'vllm'")


def _with_vllm(monkeypatch):
    monkeypatch.setattr(available, "vllm_version", lambda: "0.33.0")
    monkeypatch.setattr(available, "installed_release", lambda: Release.V0_33)


def test_vllms_shipped_execution_bugs_and_the_planted_slips_are_timed_but_no_reference():
    assert set(VLLM_SLIPS) == {"ht-missing-compute-wait", "ids-gather-early-wait"}
    assert VLLM_SHIPPED == ("vllm-exec-hang", "vllm-exec-crash")
    names = timed_variants()
    assert set(VLLM_SLIPS) <= set(names) and set(VLLM_SHIPPED) <= set(names)
    assert not {"vllm-exec", "reference"} & set(names)
    assert {n for n, v in VARIANTS.items() if not v.is_reference} <= set(names)


def test_the_reference_column_hunts_vllms_bugs_with_the_references_draws_under_its_execution(
        monkeypatch, fake_search):
    _with_vllm(monkeypatch)
    rows = detection_rows("torchrun", [7, 8, 9], 5.0, names=VLLM_ROWS, columns=(UNSTEERED,))
    assert [row.variant for row in rows] == list(VLLM_ROWS)
    executing = reference_for((("execution", "vllm"),))
    for search in fake_search:
        variant, name = search["variant"], search["variant"].name
        assert variant == unsteered(EXEC_VARIANTS[name])
        assert dict(variant.setting) == {"sut": "vllm", "execution": "vllm"}
        assert (variant.fault_kinds, variant.fault_every) == (executing.fault_kinds,
                                                              executing.fault_every)
        assert variant.drawn == executing.drawn  # no draw of the hunt's own survives
        # A shipped bug keeps its class filter, on vLLM with every other known bug fixed (its
        # fault-free examples count any failure); a slip is hunted with no filter, on vLLM with
        # its own bugs fixed, so that the reference does not find #55586 or the guard instead.
        patches = tuple(p.name for p in search["fixed"].get("vllm_patches", ()))
        if name in VLLM_SHIPPED:
            assert search["hunt"] == EXEC_VARIANTS[name].hunt
            assert patches == ("last-region-start.diff",)
        else:
            # 0.33.0 (stood in here) has no twin-threshold fix: one written for 0.34 only.
            assert search["hunt"] is None and patches == KNOWN_FIXES[:2]
        # The world each seed starts from was warmed on the same patched vLLM.
        opened = next(o for o in FakePool.opened if o["pool"] is search["pool"])
        warmed = {tuple(p.name for p in s.config.system.vllm_patches)
                  for s in opened["pool"].ran}
        assert patches in warmed
    # The world is warmed before each seed: a hang of the seed before costs no relaunch here.
    assert [s["warmed"] for s in fake_search] == list(range(1, len(fake_search) + 1))
    assert {row.note for row in rows if row.variant in VLLM_SLIPS} == {
        f"on vLLM with {', '.join(KNOWN_FIXES[:2])}"}
    assert {row.note for row in rows if row.variant in VLLM_SHIPPED} == {
        "on vLLM with last-region-start.diff"}


def test_the_known_fixes_are_read_as_written_for_the_installed_release():
    assert [p.name for p in known_fixes("0.34")] == list(KNOWN_FIXES)
    assert [p.name for p in known_fixes("0.33")] == list(KNOWN_FIXES[:2])


@pytest.mark.parametrize("world", ["sim", "torchrun"])
def test_every_planted_bug_gets_a_row_the_vllm_slips_on_their_own_setting(
        monkeypatch, fake_search, world):
    _with_vllm(monkeypatch)
    rows = detection_rows(world, [7, 8], 5.0)
    assert [row.variant for row in rows] == list(timed_variants())
    # A bug that needs more ranks than the world has gets a row saying so, never a miss.
    narrow = {n for n, v in VARIANTS.items() if world == "torchrun" and v.min_ranks > 2}
    assert {row.variant for row in rows if row.skipped} == narrow
    assert all(row.skipped.endswith("needs 3 DP ranks; this search has 2")
               for row in rows if row.skipped)
    assert all(row.seconds == (2.0, 2.0) for row in rows if not row.skipped)
    slips = [s for s in fake_search if s["variant"].name in VLLM_SLIPS]
    assert [s["variant"].name for s in slips] == [name for name in VLLM_SLIPS for _ in (7, 8)]
    for search in slips:
        setting = dict(search["variant"].setting)
        assert setting == {"sut": "vllm", "execution": "vllm"}
        assert search["fixed"] == {"release": "0.33"}  # the miniature models the installed vLLM
        assert search["hunt"] == ("stream_order",) and search["dp_sizes"] == (2,)
        opened = next(o for o in FakePool.opened if o["pool"] is search["pool"])
        assert opened["preload_vllm"]
        # The world was warmed on the slip's setting, without the slip, before any search.
        warm = opened["pool"].ran[0]
        assert search["warmed"] >= 1 and warm.config.mutation.planted() == ()
        assert warm.config.system.execution.value == "vllm"


def test_without_vllm_each_slip_row_says_skipped_and_no_world_opens(monkeypatch, fake_search,
                                                                      capsys):
    _without_vllm(monkeypatch)
    rows = detection_rows("sim", [1, 2, 3], 5.0, names=VLLM_SLIPS)
    assert [row.variant for row in rows] == list(VLLM_SLIPS)
    assert all(row.skipped.startswith("vllm not installed") for row in rows)
    assert FakePool.opened == [] and fake_search == []
    print_detection(rows)
    lines = capsys.readouterr().out.splitlines()
    for name in VLLM_SLIPS:
        line = next(line for line in lines if name in line)
        assert "skipped: vllm not installed" in line and "No module named 'vllm'" in line


def test_a_skipped_row_has_no_median_or_worst_and_prints_no_goal(capsys):
    row = DetectionRow("torchrun", "ids-gather-early-wait", (), (), skipped="vllm not installed")
    assert row.found == 0 and row.median_s() is None and row.worst_s() is None
    print_detection([row])
    line = next(line for line in capsys.readouterr().out.splitlines()
                if line.startswith("torchrun"))
    assert line.split()[:2] == ["torchrun", "ids-gather-early-wait"] and "NO" not in line


def test_the_variants_flag_picks_a_vllm_slip_alone_with_no_harness_world(monkeypatch,
                                                                         fake_search):
    _with_vllm(monkeypatch)
    rows = detection_rows("torchrun", [1], 5.0, names=("ids-gather-early-wait",))
    assert [row.variant for row in rows] == ["ids-gather-early-wait"]
    assert [o["preload_vllm"] for o in FakePool.opened] == [True]
    assert fake_search[0]["variant"] is EXEC_VARIANTS["ids-gather-early-wait"]


def test_an_unknown_variant_is_one_line_naming_the_flag_and_exit_2(capsys):
    from harness.bench.throughput import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--detection-only", "--variants", "ht-missing-compute-wait,no-such-bug"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--variants" in err and "'no-such-bug'" in err


def test_a_seed_that_found_the_bug_as_another_checker_is_a_miss_named_in_the_row(
        fake_search, capsys):
    OTHER_CHECKER[8] = "graphs_reachable"  # guard-merged is named by no_empty_region
    rows = detection_rows("sim", [7, 8], 5.0, names=("guard-merged",))
    row = rows[0]
    assert row.seconds == (2.0, None) and row.examples == (3, None) and row.found == 1
    assert row.detections == ("found", "found as graphs_reachable")
    assert row.worst_s() is None  # one seed missed: the goal is not met
    print_detection(rows)
    line = next(line for line in capsys.readouterr().out.splitlines() if "guard-merged" in line)
    assert "1/2" in line and "found as graphs_reachable" in line and "NO" in line


def test_each_seeds_finding_folder_is_removed_after_its_search(fake_search):
    detection_rows("sim", [7, 8], 5.0, names=("guard-merged",))
    folders = [Path(search["scenario_dir"]) for search in fake_search]
    assert len(set(folders)) == 2 and not any(folder.exists() for folder in folders)


def test_the_reference_column_hunts_each_bug_unsteered_beside_its_steered_search(fake_search):
    rows = detection_rows("sim", [7, 8], 5.0, names=("guard-merged", "stock-protocol"),
                          columns=COLUMNS)
    assert [(row.variant, row.column) for row in rows] == [
        ("guard-merged", STEERED), ("guard-merged", UNSTEERED),
        ("stock-protocol", STEERED), ("stock-protocol", UNSTEERED)]
    hunted = [(s["variant"], s["hunt"]) for s in fake_search]
    steered, reference = hunted[0][0], hunted[2][0]
    assert steered is VARIANTS["guard-merged"]
    assert reference == unsteered(VARIANTS["guard-merged"]) and reference.drawn == ()
    assert hunted[2][1] is None  # no hunt filter: any checker's failure ends the search
    stock = hunted[6][0]
    assert stock.fault_kinds == REFERENCE.fault_kinds and stock.fault_every == 8
    assert all(row.note == "" for row in rows)  # the reference draws stock-protocol's fault


def test_the_table_prints_the_steered_and_reference_columns_side_by_side(capsys):
    rows = [DetectionRow("sim", "stock-protocol", (2.0, 4.5), (3, 9)),
            DetectionRow("sim", "stock-protocol", (None, 40.0), (None, 300),
                         detections=("found as liveness", "found"), column=UNSTEERED,
                         note="needs a fault the reference never draws")]
    print_detection(rows)
    lines = capsys.readouterr().out.splitlines()
    head = next(line for line in lines if line.startswith("world"))
    assert head.index("steered found") < head.index("reference found")
    line = next(line for line in lines if line.startswith("sim"))
    steered, reference = line.split(" | ")[1:]
    assert steered.split()[:4] == ["2/2", "3.2", "4.5", "yes"] and "2.0/3, 4.5/9" in steered
    assert reference.split()[:5] == ["1/2", "40.0", "-", "NO", "-,"] and "40.0/300" in reference
    assert "(reference: found as liveness: misses; reference: needs a fault the reference " \
           "never draws)" in line


def test_a_reference_column_alone_prints_no_steered_column(capsys):
    print_detection([DetectionRow("sim", "guard-merged", (1.0,), (4,), column=UNSTEERED)])
    out = capsys.readouterr().out
    assert "reference found" in out and "steered found" not in out and "1.0/4" in out


def test_the_column_flag_runs_only_the_detection_tables_chosen_column(monkeypatch, capsys):
    import harness.bench.throughput as bench

    asked = []
    monkeypatch.setattr(bench, "print_throughput", lambda *a: pytest.fail("throughput ran"))
    monkeypatch.setattr(bench, "decode_examples", lambda n: pytest.fail("examples drawn"))
    monkeypatch.setattr(bench, "detection_rows", lambda *a: asked.append(a) or [])
    monkeypatch.setattr(bench, "print_detection", lambda rows: None)
    assert bench.main(["--detection-column", "reference", "--variants",
                       "guard-merged,stock-protocol", "--seeds", "2", "--budget", "7",
                       "--worlds", "sim"]) == 0
    [(world, seeds, budget, names, columns)] = asked
    assert (world, len(seeds), budget, names, columns) == (
        "sim", 2, 7.0, ("guard-merged", "stock-protocol"), (UNSTEERED,))
    assert "7 s per seed" in capsys.readouterr().out


@pytest.mark.parametrize("flags, named", [
    (["--detection-column", "reference", "--seeds", "0"], "--detection-seeds"),
    (["--detection-column", "reference", "--budget", "0"], "--detection-budget"),
    (["--detection-column", "reference", "--worlds", "simm"], "--worlds"),
    (["--detection-column", "sideways"], "--detection-column")])
def test_a_bad_detection_flag_is_one_line_naming_it_and_exit_2(capsys, flags, named):
    from harness.bench.throughput import main

    with pytest.raises(SystemExit) as exit_info:
        main(flags)
    assert exit_info.value.code == 2
    assert named in capsys.readouterr().err.strip().splitlines()[-1]
