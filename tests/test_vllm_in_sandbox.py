"""vLLM's imports take longer than a rank's step deadline under the fuzzer's timeouts (12 s on
the 2-core machine against 7 s): the sandboxed sim world loads them in its zygote before any
deadline starts, so the first vLLM scenario of a run is judged instead of timing out; and a
config vLLM refuses there is the harness's failure, exit 3 in one line, not a finding.

Skipped where vLLM does not import (`make test-vllm` installs it)."""

from __future__ import annotations

import pytest
from vllm_releases import refused_by_vllm

from harness.cli import EXIT_CANNOT, main
from harness.fuzz.engine import FUZZ_TIMEOUTS
from harness.reference_plans import judge_run
from harness.scenario import scenario_from_dict
from harness.vllm_sut.available import installed_release, unavailable_reason, vllm_version
from harness.world.sandbox.world import SandboxedSimWorld

if vllm_version() is None:
    pytest.skip(unavailable_reason(), allow_module_level=True)


def test_the_first_vllm_scenario_of_a_sandboxed_world_is_judged_not_timed_out():
    scenario = scenario_from_dict({
        "name": "first-vllm-scenario",
        "config": {"dp_size": 2, "sut": "vllm", "release": installed_release().value,
                   "capture_sizes": [8, 16], "max_num_reqs": 16, "max_num_batched_tokens": 64},
        "steps": [{"ranks": [12, 16]}, {"ranks": [3, 5]}]})
    with SandboxedSimWorld(2, FUZZ_TIMEOUTS) as world:
        result = judge_run(world.run(scenario))
        again = judge_run(world.run(scenario))
    assert result.ok, [f"{v.checker}: {v.detail}" for _, v in result.failed_verdicts()]
    assert again.ok and world.launches == 1


def test_a_config_vllm_refuses_where_the_harness_did_not_is_exit_3_in_one_line(capsys,
                                                                              tmp_path):
    code = main(["run", "--scenario", str(refused_by_vllm(tmp_path, sut="vllm"))])
    out, err = capsys.readouterr()
    assert code == EXIT_CANNOT, out
    lines = [line for line in err.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: world: ") and "max_num_batched_tokens: vLLM rejects it" \
        in lines[0], lines[0]
    assert "FAIL" not in out
