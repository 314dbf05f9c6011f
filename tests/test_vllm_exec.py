"""vLLM 0.33.0's own execution code under test (`execution: vllm`): its UBatchRunner,
ubatching contexts and ModelCudaGraphManager run every rank's step on torchrun rank
processes; its two known failures are found, named, and read clean under the fix.

Each test runs on CPU ranks over gloo (the CPU stand-ins) and, marked `gpu`, on CUDA ranks
over NCCL (real streams, events and CUDA graphs; `make test-vllm-gpu` on the GPU machine).
Skipped where vLLM does not import (`make test-vllm` installs it)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from vllm_releases import (
    SHIPS_THE_KNOWN_BUGS,
    on_installed,
    refused_by_vllm,
    release_patch,
    ships_the_known_bugs,
)

from harness.check.verdict import Outcome
from harness.cli import EXIT_CANNOT, main
from harness.config import HarnessConfig
from harness.errors import ConfigError
from harness.reference_plans import judge_run
from harness.scenario import load_scenario, scenario_from_dict
from harness.timeouts import Timeouts
from harness.vllm_code.source import VllmPatch, content_hash
from harness.vllm_sut.available import installed_release, unavailable_reason, vllm_version
from harness.world.torchrun.world import TorchrunWorld

if vllm_version() is None:
    pytest.skip(unavailable_reason(), allow_module_level=True)

# Under `--dist loadgroup` (`make test-vllm`) one worker runs the module: its world (a torchrun
# launch, 10-14 s) starts once, not on both workers and again each time one comes back to it.
pytestmark = pytest.mark.xdist_group("vllm-exec-world")
known_bugs = pytest.mark.skipif(not ships_the_known_bugs(), reason=f"pins bugs that "
                                f"{SHIPS_THE_KNOWN_BUGS} ship, this is {vllm_version()}")
ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios" / "vllm"
EXEC = SCENARIOS / "exec"  # regression scenarios of vLLM's execution code
FIX = release_patch("pr55586-unwind.diff")  # as written against the installed release
TIMEOUTS = Timeouts(collective_s=2.0, hang_s=4.0, step_deadline_s=10.0)
SMALL = {"max_num_reqs": 16, "max_num_batched_tokens": 32, "decode_threshold": 4,
         "prefill_threshold": 16}


NO_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU is visible here")


@pytest.fixture(scope="module", params=["gloo", pytest.param("nccl", marks=[pytest.mark.gpu,
                                                                           NO_GPU])])
def world(request):
    # Preloaded: on the CPU its ranks are forked from a zygote that imported vLLM once, where
    # each launch after a failure had both ranks import it again (about 8 s of CPU each).
    with TorchrunWorld(2, request.param, timeouts=TIMEOUTS, preload_vllm=True) as w:
        yield w


def run(world, data: dict, patches=()):
    scenario = on_installed(scenario_from_dict(data))
    if patches:
        config = scenario.config.with_changes(vllm_patches=patches)
        scenario = scenario_from_dict({**data, "config": config.to_dict()})
    return judge_run(world.run(scenario))


def failed(result) -> dict[str, str]:
    return {v.checker: v.detail for _, v in result.failed_verdicts()}


def test_vllms_runner_replays_its_microbatched_twin_with_the_reference_rows(world):
    result = run(world, {"config": {"execution": "vllm", "capture_sizes": [8, 16], **SMALL},
                         "steps": [{"ranks": [{"tokens": 8}, {"tokens": 7}]},
                                   {"ranks": [{"tokens": 3}, {"tokens": 16}]}]})
    assert result.ok, failed(result)
    twin = [r for r in result.steps[0].records]
    assert {r.replayed for r in twin} == {"FULL/8tok/8req/uct1/ub2"}
    assert all(len(r.captured_split) == 2 for r in twin)
    # A replay runs the captured ops, no Python receive hook: nothing to trace.
    assert all(r.vllm_exec.receives == () for r in twin)
    assert {g.label for g in result.startup[0].graphs} >= {"FULL/8tok/8req/uct1/ub2",
                                                         "FULL/16tok/16req"}


@pytest.mark.parametrize("backend", ["deepep_low_latency", "deepep_high_throughput"])
def test_vllms_eager_microbatched_steps_match_the_reference_in_both_overlap_styles(world,
                                                                                   backend):
    result = run(world, {"config": {"execution": "vllm", "cudagraph_mode": "NONE",
                                    "all2all_backend": backend, "ubatch_size": 3,
                                    "enable_dbo": False, **SMALL},
                         "steps": [{"ranks": [{"tokens": 12}, {"tokens": 9}]},
                                   {"ranks": [{"query_lens": [5, 1, 1]}, {"tokens": 16}]}]})
    assert result.ok, failed(result)
    assert {r.executed for r in result.steps[0].records} == {"eager-microbatched"}
    # Every receive was traced: issued, its hook run, read (2 per microbatch, 3 microbatches).
    receives = result.steps[0].records[0].vllm_exec.receives
    assert {e.kind for e in receives} == {"issued", "hook", "read"}
    assert len({e.receive for e in receives}) == 6
    # Each receive read after its write in stream order (logged on CPU stand-ins only).
    in_order = Outcome.HELD if world.backend == "gloo" else Outcome.NOT_APPLICABLE
    assert outcomes(result)["stream_order"] is in_order
    if backend == "deepep_high_throughput":
        events = result.steps[0].records[0].vllm_exec.stream_events
        assert any("vllm-comm" in e for e in events), events


@known_bugs
def test_the_sibling_failure_hang_is_named_by_the_vllm_frame_it_is_parked_in(world):
    data = json.loads((EXEC / "sibling-failure-hang.json").read_text())
    verdicts = failed(run(world, data))
    assert "liveness" in verdicts
    assert "vllm/v1/worker/ubatching.py" in verdicts["liveness"]
    assert "(_cpu_yield)" in verdicts["liveness"]


@known_bugs
def test_the_recv_hook_crash_is_named_with_the_attribute_error_and_its_line(world):
    data = json.loads((EXEC / "recv-hook-on-exited-context.json").read_text())
    run(world, data)  # the world is up (an earlier test may have ended it)
    launches, regroups = world.launches, world.regroups
    verdicts = failed(run(world, data))
    # Every rank survived the failure: over gloo the same processes formed a fresh group;
    # an NCCL communicator is not re-formed in place, so that world relaunched.
    soft = world.backend == "gloo"
    assert (world.launches, world.regroups) == (launches + (not soft), regroups + soft)
    assert "'NoneType' object has no attribute 'recv_hook'" in verdicts["errors"]
    assert "vllm/v1/worker/ubatching.py:" in verdicts["errors"]
    assert "(dbo_register_recv_hook)" in verdicts["errors"]


@known_bugs
@pytest.mark.parametrize("name", ["sibling-failure-hang", "recv-hook-on-exited-context"])
def test_the_unwinding_fix_reads_clean_where_vllm_0_33_fails(world, name):
    data = json.loads((EXEC / f"{name}.json").read_text())
    result = run(world, data, (FIX,))
    assert result.ok, failed(result)


# The fix rewritten to release the parked siblings three other ways, line for line (issue 44
# item 7): its own abort class, a RuntimeError chained from the failure, or a plain one.
ABORT_CLASS = ("+class UBatchAborted(RuntimeError):", "+class UBatchAborted(Exception):")
UNCHAINED = ("+            ) from state.error", "+            )")
AS_RUNTIME_ERROR = ("+            raise UBatchAborted(", "+            raise RuntimeError(")
RELEASES = {"own-class": (ABORT_CLASS, UNCHAINED),
            "chained-runtime-error": (AS_RUNTIME_ERROR,),
            "plain-runtime-error": (AS_RUNTIME_ERROR, UNCHAINED)}


def fix_releasing(way: str) -> VllmPatch:
    lines = FIX.diff.splitlines(keepends=True)
    for old, new in RELEASES[way]:
        hits = [i for i, line in enumerate(lines) if line.rstrip("\n") == old]
        assert len(hits) == 1, f"{old!r} is not one line of {FIX.name}"
        lines[hits[0]] = new + "\n"
    text = "".join(lines)
    return VllmPatch(f"pr55586-unwind-{way}.diff", content_hash(text), text)


@known_bugs
@pytest.mark.parametrize("way", sorted(RELEASES))
def test_a_fix_releasing_the_siblings_with_an_error_of_its_own_reads_clean(world, way):
    data = json.loads((EXEC / "sibling-failure-hang.json").read_text())
    result = run(world, data, (fix_releasing(way),))
    assert result.ok, failed(result)
    # Rank 0's released sibling recorded its own error, and it was judged a consequence.
    faulted = result.steps[0].records[0]
    released = [ue.error for ue in faulted.vllm_exec.ubatch_errors if ue.ubatch == 1]
    assert len(released) == 1 and "a sibling microbatch failed" in released[0].message


@known_bugs
def test_a_thread_that_fails_in_its_device_set_up_hangs_the_starter_at_the_barrier(world):
    data = {"config": {"execution": "vllm", "sut": "vllm", "cudagraph_mode": "NONE", **SMALL},
            "steps": [{"ranks": [{"tokens": 10}, {"tokens": 12}]}],
            "faults": [{"kind": "raise_in_setup", "rank": 1, "step": 0, "ubatch": 1}]}
    verdicts = failed(run(world, data))
    assert "vllm/v1/worker/gpu/ubatch_utils.py" in verdicts["liveness"]
    fixed = run(world, data, (FIX,))
    assert fixed.ok, f"{failed(fixed)}\n{fixed.evidence}"


# What the hunts found in one release's execution code, replayed where it is installed.
RELEASE_EXEC = sorted(p for p in SCENARIOS.glob("[0-9]*/*.json")
                      if '"execution": "vllm"' in p.read_text())


@pytest.mark.parametrize("path", RELEASE_EXEC, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_each_execution_finding_on_a_release_is_caught_there_and_clean_on_the_harness(
        world, path):
    if installed_release().value != path.parent.name:
        pytest.skip(f"found on vLLM {path.parent.name}; {vllm_version()} is installed")
    scenario = on_installed(load_scenario(path))
    found = judge_run(world.run(scenario))
    assert scenario.caught_by in failed(found), failed(found)
    clean = judge_run(world.run(scenario.with_reference_behaviour()))
    assert clean.ok, failed(clean)


# An execution finding on a release the project has a fix for, and the fix (patches/<release>/).
RELEASE_EXEC_FIXES = {"0.34/verify-slices-upper-bound": "verify-slices-by-device-layout.diff"}


@pytest.mark.parametrize("finding, patch", sorted(RELEASE_EXEC_FIXES.items()))
def test_an_execution_finding_replays_clean_under_its_fix_and_caught_without_it(world, finding,
                                                                                patch):
    path = SCENARIOS / f"{finding}.json"
    if installed_release().value != path.parent.name:
        pytest.skip(f"found on vLLM {path.parent.name}; {vllm_version()} is installed")
    data = json.loads(path.read_text())
    assert load_scenario(path).caught_by in failed(run(world, data))
    fixed = run(world, data, (release_patch(patch),))
    assert fixed.ok, failed(fixed)
    judged = {v.checker for v in fixed.verdicts() if v.applied}
    assert {"tokens_in_their_requests", "matches_reference"} <= judged, judged


def test_the_regression_scenarios_name_the_checker_that_catches_them():
    paths = sorted(EXEC.glob("*.json"))
    assert len(paths) == 4
    for path in paths:
        scenario = on_installed(load_scenario(path))
        assert scenario.config.system.execution.value == "vllm"
        assert scenario.caught_by in ("liveness", "errors", "stream_order")


def outcomes(result) -> dict[str, Outcome]:
    return {v.checker: v.outcome for v in result.steps[0].verdicts}


def race_caught_by_stream_order_alone(world, name: str):
    """Run the race scenario `name` and its undo: on CPU streams the rows hold and only
    stream_order fails; returns (its detail, the undone result). On CUDA streams nothing is
    logged, so the race cannot be judged there: skipped, saying so."""
    if world.backend != "gloo":
        pytest.skip("stream_order records no access on real CUDA streams: the race cannot be "
                    "judged here (TORCH_CUDA_SANITIZER=1 is the tool on a GPU)")
    result = run(world, json.loads((EXEC / f"{name}.json").read_text()))
    got = outcomes(result)
    assert got["matches_reference"] is Outcome.HELD and got["routing_provenance"] is (
        Outcome.HELD)
    assert failed(result).keys() == {"stream_order"}
    undone = run(world, load_scenario(EXEC / f"{name}.json").with_reference_behaviour()
                 .to_dict())
    assert undone.ok, failed(undone)
    return failed(result)["stream_order"], undone


def test_a_missing_compute_wait_keeps_the_rows_right_on_cpu_and_fails_stream_order(world):
    detail, undone = race_caught_by_stream_order_alone(world, "ht-missing-compute-wait")
    assert detail.startswith("rank 0 step 0: experts on stream default reads dispatch recv of "
                             "microbatch 0, written by all_to_all on stream vllm-comm-")
    assert outcomes(undone)["stream_order"] is Outcome.HELD
    order = undone.steps[0].records[0].vllm_exec.stream_order
    # The comm stream's writes were waited on: an event recorded there, waited on compute.
    assert {(op.kind, op.stream.startswith("vllm-comm")) for op in order} >= {
        ("write", True), ("read", False), ("record", True), ("wait", False)}


def test_an_ids_gather_that_waited_before_the_router_keeps_the_rows_and_fails_stream_order(
        world):
    detail, undone = race_caught_by_stream_order_alone(world, "ids-gather-early-wait")
    assert detail.startswith("rank 0 step 0: all_gather on stream vllm-comm-")
    assert "reads top-k ids of microbatch 0, written by router on stream default" in detail
    # Every rank's fingerprint holds the gather beside the all-to-alls.
    assert any(c[0] == "all_gather" for c in undone.steps[0].records[0].fingerprint)


GRAPHED = {"config": {"execution": "vllm", "capture_sizes": [8, 16], **SMALL},
           "steps": [{"ranks": [{"tokens": 8}, {"tokens": 7}]}]}


def test_a_replayed_twin_is_judged_by_stream_order_from_what_its_capture_logged(world):
    clean = run(world, GRAPHED)
    assert clean.ok, failed(clean)
    records = clean.steps[0].records
    assert {r.executed for r in records} == {"replay"}
    if world.backend != "gloo":
        assert outcomes(clean)["stream_order"] is Outcome.NOT_APPLICABLE
        return
    assert outcomes(clean)["stream_order"] is Outcome.HELD
    kinds = {(op.kind, op.subject) for op in records[0].vllm_exec.stream_order}
    assert {("write", "dispatch recv of microbatch 1"),
            ("read", "gathered ids of microbatch 1")} <= kinds
    planted = {**GRAPHED, "config": {**GRAPHED["config"], "ids_gather_wait": "before-routing"}}
    caught = run(world, planted)
    assert failed(caught).keys() == {"stream_order"}
    assert "all_gather on stream vllm-comm-" in failed(caught)["stream_order"]
    assert "written by router on stream vllm-capture-" in failed(caught)["stream_order"]


def test_vllm_execution_refuses_the_harness_execution_switches_in_one_line():
    with pytest.raises(ConfigError, match="^protocol: switches the harness's own execution"):
        HarnessConfig.of(execution="vllm", protocol="stock")


def test_a_stage_fault_of_vllms_threads_needs_vllms_execution():
    with pytest.raises(ConfigError, match=r"^faults\[0\]\.kind: raise_in_setup is a stage"):
        scenario_from_dict({"config": {}, "steps": [{"ranks": [{"tokens": 4}, {"tokens": 4}]}],
                            "faults": [{"kind": "raise_in_setup", "rank": 0}]})


def test_one_hunt_of_vllms_execution_can_be_named_and_both_run_by_default():
    from argparse import Namespace

    from harness.fuzz.command import exec_variants
    from harness.fuzz.variants import reference_for

    def names(variant: str) -> list[str]:
        return [v.name for v in exec_variants(Namespace(variant=variant, sut="vllm"))]

    assert names("vllm-exec-crash") == ["vllm-exec-crash"]
    assert names("all") == names("reference") == ["vllm-exec-hang", "vllm-exec-crash"]
    # The plain search draws as the reference does under vLLM's execution, not as the hunts.
    plain = exec_variants(Namespace(variant="reference", sut="vllm"))
    steered = exec_variants(Namespace(variant="all", sut="vllm"))
    reference = reference_for((("sut", "vllm"), ("execution", "vllm")))
    assert [v.fault_kinds for v in plain] == [reference.fault_kinds] * 2
    assert [v.drawn for v in plain] != [v.drawn for v in steered]
    assert [v.hunt for v in plain] == [v.hunt for v in steered]  # one search per class
    # A planted slip of vLLM's pattern is hunted only when named.
    assert names("ht-missing-compute-wait") == ["ht-missing-compute-wait"]
    assert names("ids-gather-early-wait") == ["ids-gather-early-wait"]
    with pytest.raises(ConfigError, match="^variant: vllm-exec-hang hunts .* needs --sut vllm"):
        exec_variants(Namespace(variant="vllm-exec-hang", sut="harness"))


def _bundle_tool():
    spec = importlib.util.spec_from_file_location("vllm_gpu_bundle",
                                                  ROOT / "tools" / "vllm_gpu_bundle.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_the_gpu_bundle_carries_what_the_execution_path_imports_and_the_image_lacks():
    tool = _bundle_tool()
    pins = tool.pinned(ROOT / "requirements" / f"vllm-{vllm_version()}.txt")
    wanted = tool.carried(pins)
    assert {"pydantic", "pydantic-core", "msgspec", "cbor2"} <= set(wanted)
    assert not {"vllm", "torch", "numpy", "transformers"} & set(wanted)
    assert set(wanted) <= set(pins)


def test_installing_a_missing_gpu_bundle_is_one_line_and_exit_2(tmp_path, capsys):
    assert _bundle_tool().install(tmp_path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{tmp_path} holds no bundle")


def test_a_rank_runtime_vllm_refuses_to_build_is_exit_3_in_one_line_not_a_startup_hang(
        capsys, tmp_path):
    # Was "FAIL startup: ranks [0, 1] did not finish capture within 120.0 s", exit 1: the
    # workers' ConfigError went as a crash.
    code = main(["run", "--scenario", str(refused_by_vllm(tmp_path, execution="vllm"))])
    out, err = capsys.readouterr()
    assert code == EXIT_CANNOT, out
    lines = [line for line in err.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: world: rank ") and "could not build its runtime: " \
        "ConfigError: max_num_batched_tokens: vLLM rejects it" in lines[0], lines[0]
    assert "FAIL" not in out
