"""vLLM's own ubatching.py under every schedule of one step (harness/vllm_exec/proof.py,
docs/schedules.md): with #55586's unwind patch every schedule of a fault-free step and of each
fault stage holds within the preemption bound; unpatched vLLM hangs or crashes under a named
schedule that replays the same verdict; a handoff race planted in a test-only patch is found
without a fault at two preemptions and replays; the judge fails a step that leaves a crash or vLLM's
global state behind. Skipped where vLLM does not import."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_releases import release_patch

from harness.faults import InjectedFault
from harness.runtime.schedule import Schedule, run_once
from harness.vllm_code.source import read_patch
from harness.vllm_exec.proof import STAGES, Step, _Record, judge_of, main, prove, scenario_of
from harness.vllm_sut.available import unavailable_reason, vllm_version

if vllm_version() is None:
    pytest.skip(unavailable_reason(), allow_module_level=True)

UNWIND = (release_patch("pr55586-unwind.diff"),)
RACE = Path(__file__).resolve().parent / "data" / "vllm" / "restore-before-wait.diff"
FAULTS = [s for s in STAGES if s != "none"]
CASES = [("none", 0)] + [(s, f) for s in FAULTS for f in (0, 1)]


@pytest.mark.parametrize("stage, faulty", CASES)
def test_every_schedule_with_one_preemption_holds_under_the_unwind_patch_at_k2(stage, faulty):
    found = prove(Step(2, stage, faulty, UNWIND), Schedule("exhaustive", preemptions=1))
    assert found.complete and found.held, found.findings[:1]
    assert found.visited > 1


@pytest.mark.parametrize("stage", STAGES)
def test_a_capture_run_holds_under_every_schedule_with_the_unwind_patch_and_not_without(stage):
    patched = prove(Step(2, stage, 0, UNWIND, capture=True), Schedule("exhaustive", preemptions=1))
    assert patched.complete and patched.held, patched.findings[:1]
    unpatched = prove(Step(2, stage, 0, capture=True), Schedule("exhaustive", preemptions=1))
    assert unpatched.held is (stage == "none")


@pytest.mark.parametrize("stage, faulty", [(s, f) for s, f in CASES if s != "none"])
def test_unpatched_vllm_hangs_or_crashes_under_a_schedule_that_replays_it(stage, faulty):
    step = Step(2, stage, faulty)
    found = prove(step, Schedule("exhaustive", preemptions=1))
    if stage in ("raise_in_combine", "raise_in_ubatch") and faulty == 1:
        # The last microbatch failing late leaves no sibling parked: vLLM holds there.
        assert found.held and found.complete
        return
    assert not found.held
    finding = found.findings[0]
    assert finding.verdict.startswith(("DEADLOCK", "microbatch ")), finding.verdict
    for _ in range(3):
        trace, verdict = run_once(finding.trace.schedule, scenario_of(step), judge_of(step))
        # The first line names the verdict (a deadlock's report goes on with the stacks).
        assert verdict.splitlines()[0] == finding.verdict.splitlines()[0]
        assert trace.choices == finding.trace.choices


def test_the_planted_restore_before_wait_race_needs_two_preemptions_and_replays():
    race = (read_patch(RACE),)
    step = Step(2, "none", 0, race)
    within_one = prove(step, Schedule("exhaustive", preemptions=1))
    assert within_one.complete and within_one.held
    found = prove(step, Schedule("exhaustive", preemptions=2))
    assert not found.held
    finding = found.findings[0]
    assert finding.verdict.startswith("microbatch ") and "AssertionError" in finding.verdict
    assert sum(d.preemptive for d in finding.trace.decisions) == 2
    for _ in range(10):
        trace, verdict = run_once(finding.trace.schedule, scenario_of(step), judge_of(step))
        assert verdict == finding.verdict and trace.choices == finding.trace.choices


def test_a_sibling_crashing_after_the_fault_is_named_even_when_the_runner_names_the_fault():
    found = prove(Step(2, "raise_in_dispatch", 0), Schedule("exhaustive", preemptions=0))
    assert found.findings[0].verdict.startswith("microbatch 1 crashed: AttributeError(")


def test_the_judge_fails_a_run_that_leaves_vllms_global_state_behind():
    step = Step(2, "none", 0, UNWIND)
    record = _Record(leftovers=("_CURRENT_CONTEXTS[0] is set",))
    verdict = judge_of(step)((record, None), None)
    assert verdict is not None and verdict.startswith("left behind: _CURRENT_CONTEXTS[0]")


def test_the_judge_fails_a_raising_stage_whose_runner_error_is_not_caused_by_the_fault():
    step = Step(2, "raise_in_dispatch", 0, UNWIND)
    error = RuntimeError("Microbatch 0 of 2 failed")
    error.__cause__ = KeyError("x")
    error.record = _Record()  # type: ignore[attr-defined]
    assert "not the injected fault" in judge_of(step)(None, error)
    error.__cause__ = InjectedFault("microbatch 0's dispatch")
    assert judge_of(step)(None, error) is None


def test_the_proof_command_exits_0_when_every_schedule_held_and_1_on_a_finding(capsys):
    patch = str(UNWIND[0].path)
    args = ["--k", "2", "--preemptions", "1", "--stage", "raise_in_setup"]
    assert main([*args, "--vllm-patch", patch]) == 0
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "DEADLOCK: at ready.wait" in out and '"mode": "exhaustive"' in out


def test_a_missing_patch_file_is_one_line_naming_the_field_and_exit_2(capsys, tmp_path):
    assert main(["--k", "2", "--vllm-patch", str(tmp_path / "absent.diff")]) == 2
    assert capsys.readouterr().err.startswith("error: vllm_patch: ")


@pytest.mark.slow
@pytest.mark.parametrize("stage, faulty", CASES)
def test_every_schedule_with_two_preemptions_holds_under_the_unwind_patch_at_k2(stage, faulty):
    found = prove(Step(2, stage, faulty, UNWIND), Schedule("exhaustive", preemptions=2))
    assert found.complete and found.held, found.findings[:1]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("stage, faulty", [("none", 0)] + [(s, f) for s in FAULTS
                                                           for f in (0, 1, 2)])
def test_every_schedule_with_one_preemption_holds_under_the_unwind_patch_at_k3(stage, faulty):
    found = prove(Step(3, stage, faulty, UNWIND), Schedule("exhaustive", preemptions=1))
    assert found.complete and found.held, found.findings[:1]
