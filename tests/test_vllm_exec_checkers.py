"""The checkers of steps on vLLM's execution code, over hand-made records (no vLLM needed):
each fails when what it guards is broken, and holds when a fault's consequences are only
consequences."""

from __future__ import annotations

from harness.check.checkers import check_errors, check_liveness
from harness.check.stacks import parked_frames
from harness.check.vllm_exec import check_recv_before_read, check_ubatching_state
from harness.errors import ErrorOrigin
from harness.history.records import RecvEvent, StepRecord, UbatchError, VllmExecTrace
from harness.history.step_error import StepError

INJECTED = StepError("RuntimeError", "Microbatch 0 of 2 failed", "InjectedFault: boom",
                     ErrorOrigin.INJECTED)
TIMEOUT = StepError("CollectiveTimeout", "all_to_all did not complete", None, ErrorOrigin.TIMEOUT)
CRASH = StepError("AttributeError", "'NoneType' object has no attribute 'recv_hook'", None,
                  ErrorOrigin.RAISED)
WHERE = "/x/vllm/v1/worker/ubatching.py:201 (dbo_register_recv_hook)"


def record(rank: int, *, error=None, fault=False, ubatch_errors=(), receives=(),
           leftovers=()) -> StepRecord:
    failed = StepRecord.failed(rank, 0, error, injected_fault=fault) if error else None
    base = failed or StepRecord.failed(rank, 0, INJECTED, injected_fault=fault)
    trace = VllmExecTrace(tuple(ubatch_errors), tuple(receives), tuple(leftovers))
    return StepRecord(**{**base.__dict__, "error": error, "vllm_exec": trace})


def test_a_microbatch_crash_no_fault_explains_fails_errors_with_its_line():
    records = [record(0, error=INJECTED, fault=True,
                      ubatch_errors=[UbatchError(0, INJECTED, "model.py:1 (f)"),
                                     UbatchError(1, CRASH, WHERE)]),
               record(1, error=TIMEOUT)]
    verdict = check_errors(records)
    assert not verdict.ok
    assert verdict.detail.startswith("rank 0 microbatch 1 crashed: AttributeError")
    assert WHERE in verdict.detail


def test_a_faults_own_error_and_a_peers_timeout_are_consequences():
    records = [record(0, error=INJECTED, fault=True,
                      ubatch_errors=[UbatchError(0, INJECTED, "model.py:1 (f)")]),
               record(1, error=TIMEOUT, ubatch_errors=[UbatchError(1, TIMEOUT, "comm.py:1")])]
    assert check_errors(records).ok


def test_a_peers_timeout_beside_a_rank_that_never_reported_is_a_consequence():
    # The faulted rank hung (no record): its peer's timeout waited on it.
    assert check_errors([None, record(1, error=TIMEOUT)]).ok
    assert not check_errors([None, record(1, error=CRASH)]).ok


def test_a_read_before_its_receive_hook_ran_fails_and_the_right_order_holds():
    good = [RecvEvent("issued", 0, 0, "dispatch"), RecvEvent("hook", 0, 1, "dispatch"),
            RecvEvent("read", 0, 0, "dispatch")]
    bad = [good[0], good[2], good[1]]
    assert check_recv_before_read([record(0, receives=good), record(1, receives=good)]).ok
    verdict = check_recv_before_read([record(0, receives=good), record(1, receives=bad)])
    assert not verdict.ok and verdict.detail.startswith("rank 1 microbatch 0 read its dispatch")


def test_ubatching_state_left_set_after_a_step_fails_on_the_last_rank_too():
    clean = record(0)
    assert check_ubatching_state([clean, record(1)]).ok
    verdict = check_ubatching_state([clean, record(1, leftovers=["_CURRENT_CONTEXTS[1] is set"])])
    assert not verdict.ok and "rank 1" in verdict.detail


EVIDENCE = """ranks [0] missed their deadline at step 0
--- rank 0 stacks ---
Thread 0x00007f01 (most recent call first):
  File "/lib/threading.py", line 327 in wait
  File "/site/vllm/v1/worker/ubatching.py", line 103 in _cpu_yield
  File "/site/vllm/v1/worker/ubatching.py", line 130 in yield_
  File "/repo/harness/vllm_exec/model.py", line 178 in _yield

Current thread 0x00007f02 (most recent call first):
  File "/lib/threading.py", line 1119 in join
  File "/site/vllm/v1/worker/gpu/ubatch_utils.py", line 518 in finish
--- rank 1 stacks ---
Current thread 0x00007f03 (most recent call first):
  File "/repo/harness/world/torchrun/worker.py", line 139 in serve
"""


def test_a_hung_rank_is_named_by_the_innermost_vllm_frame_of_each_parked_thread():
    assert parked_frames(EVIDENCE, 0) == ["vllm/v1/worker/ubatching.py:103 (_cpu_yield)",
                                          "vllm/v1/worker/gpu/ubatch_utils.py:518 (finish)"]
    assert parked_frames(EVIDENCE, 1) == []
    verdict = check_liveness([None, record(1)], 3.0, EVIDENCE)
    assert not verdict.ok and "rank 0 parked at vllm/v1/worker/ubatching.py:103" in verdict.detail


def test_only_the_last_dump_of_a_rank_counts():
    older = EVIDENCE.replace("line 103 in _cpu_yield", "line 99 in __enter__")
    twice = older.replace("--- rank 1 stacks ---", EVIDENCE.split("--- rank 0 stacks ---\n")[1]
                          .split("--- rank 1")[0] + "--- rank 1 stacks ---")
    assert parked_frames(twice, 0)[0] == "vllm/v1/worker/ubatching.py:103 (_cpu_yield)"


def test_a_step_every_rank_hangs_in_gets_a_row_so_its_hang_is_judged():
    from harness.scenario import scenario_from_dict
    from harness.world.torchrun.collect import _open_hung_step

    scenario = scenario_from_dict({"config": {}, "steps": [{"ranks": [4, 4]}, {"ranks": [4, 4]}]})
    startup = ["captured", "captured"]
    done = [[record(0, error=None), record(1, error=None)]]
    _open_hung_step(scenario, startup, done, 2)
    assert done[-1] == [None, None]
    failed = [[record(0, error=CRASH), record(1, error=None)]]
    _open_hung_step(scenario, startup, failed, 2)  # ranks stop after a failed step
    assert len(failed) == 1
    last = [[None, None], [None, None]]
    _open_hung_step(scenario, startup, last, 2)  # no step beyond the scenario's
    assert len(last) == 2


def test_vllm_execution_over_gloo_on_cuda_is_one_line_and_exit_2(capsys):
    from harness.cli import main

    assert main(["fuzz", "--exec", "vllm", "--world", "torchrun", "--nproc", "2",
                 "--backend", "gloo", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: device: --exec vllm over gloo runs on CPU ranks (gloo's CUDA "
                   "collectives cannot be captured): use --backend nccl for CUDA"]
