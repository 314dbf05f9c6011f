"""CUDA's sanitizer must see the microbatch threads' tensor accesses (harness/runtime/
sanitizer.py): its one dispatch mode is entered in each thread a step runs on. On CPU a
logging mode stands in for it, entered where the sanitizer would be enabled. vLLM's threads
(harness/vllm_exec/model.py) run only in rank processes: the GPU run checks those."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from torch.utils._python_dispatch import TorchDispatchMode

from harness.check.judge import judge
from harness.runtime import sanitizer
from harness.scenario import scenario_from_dict
from harness.timeouts import Timeouts
from harness.world.sim.world import SimWorld


class ThreadLog(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.threads: set[str] = set()
        self.lock = threading.Lock()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        with self.lock:
            self.threads.add(threading.current_thread().name)
        return func(*args, **(kwargs or {}))


SPLIT_EAGERLY = {"config": {"cudagraph_mode": "NONE", "max_num_reqs": 8,
                            "max_num_batched_tokens": 64, "decode_threshold": 2,
                            "prefill_threshold": 4},
                 "steps": [{"ranks": [{"tokens": 8}, {"tokens": 8}]}]}


def threads_seen(monkeypatch, data: dict) -> set[str]:
    log = ThreadLog()
    monkeypatch.setattr(sanitizer, "_enabled_mode", lambda: log)
    world = SimWorld(2, Timeouts())
    try:
        assert judge(world.run(scenario_from_dict(data))).ok
    finally:
        world.close()
    return log.threads


def test_the_sanitizers_mode_sees_every_microbatch_threads_ops(monkeypatch):
    assert {"ubatch-0", "ubatch-1"} <= threads_seen(monkeypatch, SPLIT_EAGERLY)


def test_without_a_sanitizer_no_mode_is_entered(monkeypatch):
    monkeypatch.setattr(sanitizer, "_enabled_mode", lambda: None)
    with sanitizer.sanitized_thread():
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
        assert _get_current_dispatch_mode_stack() == []


def test_a_thread_already_under_the_mode_does_not_enter_it_twice(monkeypatch):
    log = ThreadLog()
    monkeypatch.setattr(sanitizer, "_enabled_mode", lambda: log)
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    with log, sanitizer.sanitized_thread():
        assert _get_current_dispatch_mode_stack() == [log]



def test_looking_for_the_sanitizer_does_not_import_it_and_turn_on_cudas_trace_hooks():
    # Importing torch.cuda._sanitizer activates the process-wide GPU trace hooks: asking
    # whether it is on must leave it unimported when TORCH_CUDA_SANITIZER is not set.
    code = ("import sys, torch\n"
            "from harness.runtime import sanitizer\n"
            "with sanitizer.sanitized_thread():\n"
            "    sanitizer.announce_written(torch.zeros(1))\n"
            "print('torch.cuda._sanitizer' in sys.modules)\n")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CUDA_SANITIZER"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "False"
