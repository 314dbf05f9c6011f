"""How `run` and `check` show a judged scenario: every verdict per phase (start-up, each step,
the whole scenario), as text or one JSON object, then each checker's coverage (verdicts held,
failed, not applicable), and the exit code that goes with them. One printer, so a saved run
judged again reads exactly as the run did."""

from __future__ import annotations

import json

from harness.check.coverage import coverage_lines, coverage_of_verdicts
from harness.check.history_file import Tested
from harness.check.judge import ScenarioResult, StepResult
from harness.check.verdict import Outcome
from harness.cli_vllm import tested_vllm, tested_vllm_json
from harness.config import HarnessConfig

# 3: the harness itself could not do what was asked (harness.errors.HarnessCannot).
EXIT_OK, EXIT_FOUND, EXIT_BAD_INPUT, EXIT_CANNOT = 0, 1, 2, 3

VERDICT_MARKS = {Outcome.HELD: "ok  ", Outcome.FAILED: "FAIL", Outcome.NOT_APPLICABLE: "n/a "}


def tested_of(config: HarnessConfig, note: str = "") -> Tested:
    """The lines naming what a run tested, computed once so a saved run can carry them."""
    return Tested(note, tested_vllm(config), tested_vllm_json(config))


def print_tested(tested: Tested) -> None:
    for line in (tested.note, tested.vllm):
        if line:
            print(line)


def _verdict_lines(verdicts) -> list[str]:
    return [f"  {VERDICT_MARKS[v.outcome]} {v.checker}" + (f": {v.detail}" if v.detail else "")
            for v in verdicts]


def _step_title(step: StepResult) -> str:
    kinds = sorted({r.executed for r in step.records if r is not None})
    return "/".join(kinds) or "no rank finished"


def _print_json(result: ScenarioResult, tested: Tested) -> None:
    print(json.dumps({
        "ok": result.ok,
        "coverage": [c.to_dict() for c in coverage_of_verdicts(result.verdicts())],
        "startup": [v.to_dict() for v in result.startup_verdicts],
        "steps": [{"verdicts": [v.to_dict() for v in step.verdicts]} for step in result.steps],
        "scenario_verdicts": [v.to_dict() for v in result.scenario_verdicts],
        "scenario": None if result.ok else json.loads(result.scenario.to_json()),
        "vllm": tested.vllm_json}))


def _print_text(result: ScenarioResult, tested: Tested) -> None:
    scenario = result.scenario
    print_tested(tested)
    print(f"scenario {scenario.name!r}: {scenario.config.serving.dp_size} ranks, "
          f"{len(scenario.steps)} steps")
    print("startup (capture):")
    print("\n".join(_verdict_lines(result.startup_verdicts)))
    for i, step in enumerate(result.steps):
        print(f"step {i} ({_step_title(step)}):")
        print("\n".join(_verdict_lines(step.verdicts)))
    if len(result.steps) < len(scenario.steps):
        print(f"stopped after step {len(result.steps) - 1}: a rank failed or hung"
              if result.steps else "no step ran: capture failed")
    print("scenario (every step):")
    print("\n".join(_verdict_lines(result.scenario_verdicts)))
    print("\n".join(coverage_lines(coverage_of_verdicts(result.verdicts()), "this run")))
    if result.ok:
        verdicts = result.verdicts()
        held = sum(v.outcome is Outcome.HELD for v in verdicts)
        print(f"no checker failed: {held} verdicts held, {len(verdicts) - held} not "
              "applicable (nothing to judge)")
    else:
        print("FAILED; the scenario, to replay with `python -m harness run --scenario FILE`:")
        print(scenario.to_json())


def show_result(result: ScenarioResult, tested: Tested, as_json: bool) -> int:
    """Print the result (one JSON object with `as_json`) and return the exit code."""
    (_print_json if as_json else _print_text)(result, tested)
    return EXIT_OK if result.ok else EXIT_FOUND
