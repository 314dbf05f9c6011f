"""Where the search aims: `target()` values and the steps a fault is aimed at.

Both come from the spec's decision (harness/spec) under the reference switches, never from
the system under test: a bug planted there, by a variant's switch or a slip in its code,
must not bend the search that hunts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from harness.batch import RankBatch
from harness.config import HarnessConfig, Mutation
from harness.history.decision import StepPlan
from harness.scenario import Scenario
from harness.spec.decision import graph_table, last_region_start, spec_plans


def reference_plans(config: HarnessConfig, batches: Sequence[RankBatch]) -> list[StepPlan]:
    """Every rank's plan as docs/spec.md decides it with no mutation (the variant's planted
    decision bug undone)."""
    return spec_plans(replace(config, mutation=Mutation()), batches)


def straddled_graphs(config: HarnessConfig) -> tuple[int, ...]:
    """The graph sizes a straddle aims at: the twins of single-token requests the config
    captures, the only graphs a split step replays and so where the guard decides (0.34's
    decode twins sit at the request limit, off the capture sizes); else the capture sizes."""
    twins = sorted({d.num_tokens for d in graph_table(config)
                    if d.num_ubatches > 1 and (d.uniform_token_count or 1) == 1})
    return tuple(twins) or config.cudagraph_capture_sizes


def steps_with_microbatch_threads(config: HarnessConfig,
                                  steps: Sequence[Sequence[RankBatch]]) -> list[int]:
    """The steps the reference decision runs as eager microbatched steps."""
    return [i for i, batches in enumerate(steps)
            if reference_plans(config, batches)[0].kind == "eager-microbatched"]


def steering(scenario: Scenario) -> dict[str, float]:
    """What `target()` maximises: closeness of the smallest rank to the last region start of
    the graph the largest rank pads to (the guard boundary), the most padding of a rank, and
    the number of steps that replay a microbatched graph."""
    config = scenario.config
    k = max(config.num_ubatches, 2)
    closeness, padding, twin_replays = -float(config.serving.max_num_batched_tokens), 0.0, 0.0
    for i in range(len(scenario.steps)):
        batches = scenario.batches(i)
        counts = [b.num_tokens for b in batches]
        graph = next((g for g in config.cudagraph_capture_sizes if g >= max(counts)), None)
        if graph is not None:
            boundary = last_region_start(graph, k)
            closeness = max(closeness, -float(abs(min(counts) - boundary)))
        plans = reference_plans(config, batches)
        padding = max(padding, *(float(p.num_tokens - p.real_tokens) for p in plans))
        # Steps that replay a twin: rare once k >= 3 (the guard wants min > (G // k) * (k-1)).
        twin_replays += float(plans[0].kind == "full-microbatched")
    return {"guard boundary closeness": closeness, "padding": padding,
            "microbatched replays": twin_replays}
