"""The single-rank GPU world behind the World protocol, run here on its CPU form (gloo,
emulated graphs): the same `run(scenario)` the GPU machine runs, judged by every checker."""

from __future__ import annotations

import pytest

from harness.check.judge import judge
from harness.errors import ConfigError
from harness.scenario import scenario_from_dict
from harness.timeouts import Timeouts
from harness.world.gpu.world import open_single_rank_cpu_world
from harness.world.protocol import World

FAST = Timeouts(collective_s=2.0, hang_s=4.0, step_deadline_s=15.0)
CONFIG = {"dp_size": 1, "single_rank_gpu_world": True, "capture_sizes": [8, 16],
          "max_num_reqs": 16, "max_num_batched_tokens": 16, "decode_threshold": 4,
          "prefill_threshold": 16}


def one_rank(steps: list[int], faults: list | None = None, config: dict | None = None):
    return scenario_from_dict({"config": config or CONFIG,
                               "steps": [{"ranks": [{"tokens": n}]} for n in steps],
                               "faults": faults or []})


@pytest.fixture(scope="module")
def world():
    with open_single_rank_cpu_world(timeouts=FAST) as w:
        yield w


def test_the_single_rank_world_is_a_world_of_one_rank_that_leaves_no_process(world):
    members = {*World.__annotations__, *(n for n in vars(World) if not n.startswith("_")),
               "__enter__", "__exit__"} - {"_is_protocol"}
    assert all(hasattr(world, name) for name in members), sorted(members)
    assert (world.nproc, world.graphs, world.timeouts) == (1, "emulated", FAST)


def test_a_scenario_run_on_it_is_a_history_every_checker_holds_on(world):
    history = world.run(one_rank([16, 6, 3]))
    assert len(history.startup) == 1 and [len(s) for s in history.steps] == [1, 1, 1]
    result = judge(history)
    assert result.ok, result.failed_verdicts()
    assert [step.records[0].executed for step in result.steps] == ["replay"] * 3


def test_a_failed_step_ends_the_scenario_there_and_the_world_is_rebuilt_for_the_next(world):
    builds = world.builds
    # Eager, so that the microbatch threads run the step the fault is injected into.
    faulty = one_rank([16, 16, 16], [{"kind": "raise_in_ubatch", "rank": 0, "step": 1}],
                      {**CONFIG, "cudagraph_mode": "NONE"})
    history = world.run(faulty)
    assert len(history.steps) == 2 and history.steps[1][0].error is not None
    assert world.builds == builds + 1
    assert judge(world.run(one_rank([16]))).ok


def test_a_scenario_of_two_ranks_or_a_fault_that_ends_the_process_is_refused(world):
    two = scenario_from_dict({"config": {**CONFIG, "dp_size": 2, "single_rank_gpu_world": False},
                              "steps": [{"ranks": [{"tokens": 4}, {"tokens": 4}]}]})
    with pytest.raises(ConfigError, match="^dp_size: the scenario has 2 ranks"):
        world.run(two)
    with pytest.raises(ConfigError, match=r"^faults\[0\]\.kind: ends the process"):
        world.run(one_rank([4], [{"kind": "kill_rank", "rank": 0, "step": 0}]))


def test_a_closed_world_leaves_no_process_and_refuses_to_run():
    world = open_single_rank_cpu_world(timeouts=FAST)
    assert world.close() == []
    with pytest.raises(RuntimeError, match="closed"):
        world.run(one_rank([4]))
