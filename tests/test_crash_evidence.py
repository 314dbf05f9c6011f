"""A rank whose process dies of a fatal signal is named with the signal and the collective it
last issued, read from what its worker leaves in the world's trace directory."""

from __future__ import annotations

from dataclasses import replace

from harness.check.checkers import check_errors
from harness.errors import ErrorOrigin
from harness.faults import Fault, FaultKind
from harness.history.records import StepRecord
from harness.history.step_error import StepError
from harness.scenario import scenario_from_dict
from harness.world.evidence import fatal_error, last_collective
from harness.world.torchrun.collect import _lost_error

SCENARIO = scenario_from_dict({"steps": [{"ranks": [4, 8]}]})


def leave_traces(tmp_path, rank: int, stacks: str, trace: str) -> None:
    (tmp_path / f"stacks-{rank}.txt").write_text(stacks)
    (tmp_path / f"collectives-{rank}.txt").write_text(trace)


def test_a_segfault_in_an_all_to_all_is_named_with_both(tmp_path):
    leave_traces(tmp_path, 1, "Fatal Python error: Segmentation fault\n\nThread 0x1 ...\n",
                 "-- step 0\n#0 all_reduce [6, 2] int32\n#1 all_to_all [258, 19] float64\n")
    error = _lost_error(1, SCENARIO, tmp_path)
    assert error == StepError("RankCrashed", "died of a fatal signal (Segmentation fault); its "
                              "last collective: all_to_all [258, 19] float64", None,
                              ErrorOrigin.CRASHED)


def test_the_last_collective_is_that_of_the_latest_step_only(tmp_path):
    leave_traces(tmp_path, 0, "", "-- step 0\n#0 all_reduce [6, 2] int32\n-- step 1\n")
    assert last_collective(tmp_path, 0) is None
    assert fatal_error(tmp_path, 0) is None  # no fatal line: it did not die of a signal
    assert _lost_error(0, SCENARIO, tmp_path).kind == "RankLost"


def test_an_injected_abort_is_the_fault_and_a_real_crash_is_a_finding(tmp_path):
    leave_traces(tmp_path, 1, "Fatal Python error: Aborted\n", "-- step 0\n")
    injected = replace(SCENARIO, faults=(Fault(FaultKind.ABORT_RANK, 1, 0),))
    assert _lost_error(1, injected, tmp_path).origin is ErrorOrigin.INJECTED
    crash = _lost_error(1, SCENARIO, tmp_path)
    peer = StepRecord.failed(0, 0, StepError("CollectiveTimeout", "", None,
                                             ErrorOrigin.TIMEOUT))
    verdict = check_errors([peer, StepRecord.failed(1, 0, crash)])
    assert not verdict.ok
    assert "RankCrashed: died of a fatal signal (Aborted)" in verdict.detail
