"""Properties of the decision layer over Hypothesis-drawn configs and DP skews."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, find, given, settings
from hypothesis import strategies as st

from harness.check.agreement import first_disagreement
from harness.config import CudaGraphMode, Guard
from harness.gen.strategies import configs, steps
from harness.sut.descriptor import is_compatible
from harness.sut.step_plan import graph_table_for, plan_without_world


@st.composite
def dispatch_queries(draw):
    config = draw(configs())
    k = config.num_ubatches
    num_tokens = draw(st.integers(0, config.serving.max_num_batched_tokens + 8))
    num_reqs = draw(st.integers(0, max(num_tokens, 1)))
    uct = draw(st.sampled_from([None, 1, 2]))
    return config, dict(num_reqs=num_reqs, num_tokens=num_tokens, uniform_token_count=uct,
                        num_ubatches=draw(st.sampled_from([1, k])))


@given(dispatch_queries())
def test_dispatch_returns_the_smallest_compatible_graph_full_before_piecewise(case):
    config, query = case
    table = graph_table_for(config, 0)
    got = table.dispatch(query["num_reqs"], query["num_tokens"], query["uniform_token_count"],
                         num_ubatches=query["num_ubatches"])
    compatible = [d for d in table.descriptors
                  if query["num_tokens"] > 0 and is_compatible(d, **query)]
    full = [d for d in compatible if d.cg_mode is CudaGraphMode.FULL]
    if not compatible:
        assert got.cg_mode is CudaGraphMode.NONE
        assert (got.num_tokens, got.num_ubatches) == (query["num_tokens"], query["num_ubatches"])
        return
    assert got in compatible
    if full:
        assert got.cg_mode is CudaGraphMode.FULL
        assert got.num_tokens == min(d.num_tokens for d in full)
    else:
        assert got.num_tokens == min(d.num_tokens for d in compatible)


@given(steps())
def test_every_rank_derives_the_same_decision_from_the_gathered_matrix(step):
    config, batches = step
    plans = plan_without_world(config, batches)
    disagreement = first_disagreement(plans)
    assert disagreement is None, disagreement.describe()


@given(steps())
def test_microbatched_steps_pad_every_rank_to_one_size_split_the_same_way(step):
    config, batches = step
    plans = plan_without_world(config, batches)
    if plans[0].desc.num_ubatches == 1:
        return
    assert len({p.num_tokens for p in plans}) == 1
    assert all(len(p.regions) == config.num_ubatches for p in plans)
    assert all(sum(r.tokens for r in p.regions) == p.num_tokens for p in plans)
    assert plans[0].num_tokens >= max(b.num_tokens for b in batches)


@given(steps())
def test_with_the_fixed_guard_a_replayed_microbatched_graph_has_a_real_token_in_every_region(
        step):
    config, batches = step
    for plan in plan_without_world(config, batches):
        if plan.kind == "full-microbatched":
            empty = [i for i, r in enumerate(plan.regions) if r.real_tokens == 0]
            assert not empty, f"rank {plan.rank} replays {plan.desc.label()} with empty " \
                              f"regions {empty}"


def _replays_an_empty_region(step) -> bool:
    config, batches = step
    return any(plan.kind == "full-microbatched" and any(r.real_tokens == 0 for r in plan.regions)
               for plan in plan_without_world(config, batches))


def test_hypothesis_finds_the_merged_guard_bug_by_itself_and_shrinks_it_to_half_the_graph():
    merged = configs(dp_sizes=(2,), ubatch_counts=(2,), guards=(Guard.MERGED,),
                     modes=(CudaGraphMode.FULL, CudaGraphMode.FULL_AND_PIECEWISE))
    config, batches = find(
        steps(merged), _replays_an_empty_region,
        settings=settings(max_examples=5000, database=None, derandomize=True,
                          suppress_health_check=list(HealthCheck)))
    plans = plan_without_world(config, batches)
    graph_tokens = plans[0].desc.num_tokens
    smallest = min(b.num_tokens for b in batches)
    # The merged guard admits exactly one bad minimum: half of an even graph size.
    assert graph_tokens % 2 == 0
    assert smallest == graph_tokens // 2
    assert plans[0].kind == "full-microbatched"


@given(steps(configs(guards=(Guard.FIXED, Guard.MERGED, Guard.STRICT_K2))))
def test_guards_differ_only_on_the_microbatched_graph_versus_eager_choice(step):
    config, batches = step
    assume(config.serving.cudagraph_mode is not CudaGraphMode.NONE)
    kinds = {guard: [p.kind for p in plan_without_world(config.with_changes(guard=guard),
                                                        batches)]
             for guard in Guard}
    for a in Guard:
        for b in Guard:
            for ka, kb in zip(kinds[a], kinds[b], strict=True):
                if ka != kb:
                    assert {ka, kb} == {"full-microbatched", "eager-microbatched"}
