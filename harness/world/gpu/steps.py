"""Steps on the single-rank world, each checked against the CPU reference.

The rank code is the same as in every world (`RankRuntime`); only the comparison moves the
device's rows to the CPU, where the reference runs on the same seeded weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harness.batch import RankBatch
from harness.config import HarnessConfig
from harness.history.decision import GraphDescriptor
from harness.history.records import StepRecord, rows_tensor
from harness.model.reference import ReferenceStep, diff_against_reference, reference_step
from harness.model.state import RequestSpec, initial_state
from harness.scenario import Scenario
from harness.sut.rank_runtime import RankRuntime
from harness.sut.step_loop import run_steps


def one_rank_scenario(config: HarnessConfig, *steps: Sequence[int]) -> Scenario:
    """Per step, the single rank's query lengths (a decode batch of n is `(1,) * n`)."""
    return Scenario(config, tuple((RankBatch.from_query_lens(lens),) for lens in steps),
                    name="single-rank-gpu")


def decode(n: int) -> tuple[int, ...]:
    return (1,) * n


@dataclass(frozen=True)
class CheckedStep:
    record: StepRecord
    reference: ReferenceStep
    problems: tuple[str, ...]  # rows and state slots that differ from the reference

    @property
    def output(self) -> torch.Tensor:
        return rows_tensor(self.record.outputs)

    @property
    def state(self) -> torch.Tensor:
        return rows_tensor(self.record.state)

    def describe(self) -> str:
        rec = self.record
        graph = rec.plan.desc.label() if rec.plan is not None else "-"
        error = f", error {rec.error.describe()}" if rec.error is not None else ""
        return (f"step {rec.step}: {rec.executed} on {graph}{error}; "
                f"{len(self.problems)} differences {list(self.problems[:3])}")


def run_checked(runtime: RankRuntime, scenario: Scenario, atol: float = 1e-9
                ) -> list[CheckedStep]:
    """Run every step of `scenario` from the initial state on the single rank, and compare
    each step's real rows and state with the reference (chained from step to step)."""
    config = scenario.config
    weights = runtime.model.weights.to("cpu")
    runtime.reset_state()
    states = [initial_state(config, runtime.rank)]

    def checked(i: int, requests, ranks) -> CheckedStep:
        nonlocal states
        record = runtime.step(i, requests[runtime.rank], ranks[runtime.rank])
        ref = reference_step(config, weights, requests, states)
        states = ref.states
        problems = diff_against_reference(ref, [rows_tensor(record.outputs)],
                                          [rows_tensor(record.state)], atol=atol)
        if record.error is not None:
            problems.insert(0, f"the step failed: {record.error.describe()}")
        return CheckedStep(record, ref, tuple(problems))

    # Every step is compared, failed or not: one rank has no peer left waiting on it.
    return run_steps(scenario, checked, lambda _: True)


def eager_rerun(runtime: RankRuntime, desc: GraphDescriptor,
                requests: Sequence[RequestSpec], query_lens: Sequence[int]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The same step run eagerly (microbatched on the threads when `desc` is) from the
    initial state, on fresh buffers: (real output rows, state), on the CPU."""
    runtime.reset_state()
    buffers = runtime._eager_buffers(desc.num_tokens, desc.num_reqs, requests)
    runtime.manager.run_eager(desc, buffers, query_lens)
    real = sum(r.query_len for r in requests)
    return buffers.output[:real].cpu(), runtime.cache.state.cpu()
