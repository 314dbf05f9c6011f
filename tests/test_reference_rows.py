"""The judge's reference, rank by rank and remembered, equals the plain model run over every
rank's requests at once, step after step."""

import pytest

from harness.check.reference import reference_rows
from harness.history.records import rows_of
from harness.model.reference import reference_step
from harness.model.state import initial_state
from harness.model.weights import MoEWeights
from harness.reference_plans import references_for
from harness.scenario import scenario_from_dict
from harness.sut.step_plan import plan_without_world

CONFIG = {"capture_sizes": [16, 32], "max_num_reqs": 16, "max_num_batched_tokens": 32,
          "decode_threshold": 8, "prefill_threshold": 16, "dp_size": 3}


def whole_batch(scenario):
    """The reference computed as before: every rank of a step in one model call."""
    config = scenario.config
    weights = MoEWeights.build(config)
    states = [initial_state(config, r) for r in range(config.serving.dp_size)]
    out = []
    for requests in scenario.requests():
        ref = reference_step(config, weights, requests, states)
        states = ref.states
        out.append(([rows_of(t) for t in ref.outputs], [rows_of(t) for t in ref.states],
                    [tuple(sorted(c.elements())) for c in ref.routes]))
    return out


def scenario(steps):
    return scenario_from_dict({"config": CONFIG,
                               "steps": [{"ranks": [{"query_lens": q} for q in ranks]}
                                         for ranks in steps]})


def test_the_rank_by_rank_reference_equals_the_whole_batch_one_over_several_steps():
    s = scenario([[[1, 2], [3], []], [[1, 1], [2, 1], [4]], [[1], [1, 1, 1], [1]]])
    for got, (outputs, states, routes) in zip(reference_rows(s), whole_batch(s), strict=True):
        assert list(got.outputs) == outputs
        assert list(got.states) == states
        assert list(got.routes) == routes


def test_a_remembered_rank_history_still_feeds_each_step_from_its_own_previous_state():
    # Rank 0's first step is shared with an earlier scenario; its second step must start from
    # the state that step left, not from the initial state or another rank's.
    first = scenario([[[2], [1], [1]]])
    reference_rows(first)
    later = scenario([[[2], [3], [1]], [[1], [1], [2]]])
    for got, (outputs, states, routes) in zip(reference_rows(later), whole_batch(later),
                                              strict=True):
        assert list(got.outputs) == outputs
        assert list(got.states) == states
        assert list(got.routes) == routes


def test_another_systems_reference_needs_the_plans_made_outside_the_judge():
    # The judge cannot make the harness's own plans (it imports no rank code): without them
    # the differential would have nothing to compare with, so it is refused, never N/A.
    vllm = scenario_from_dict({"config": {**CONFIG, "sut": "vllm"},
                               "steps": [{"ranks": [9, 16, 0]}, {"ranks": [16, 16, 16]}]})
    with pytest.raises(ValueError, match="reference_plans.references_for"):
        reference_rows(vllm)
    got = references_for(vllm)
    harness = vllm.config.with_changes(sut="harness")
    assert [r.plans for r in got] == [tuple(plan_without_world(harness, vllm.batches(i)))
                                      for i in range(2)]
    assert all(r.spec_plans is None and r.base_plans is None for r in got)
    plain = scenario_from_dict({"config": CONFIG, "steps": [{"ranks": [9, 16, 0]}]})
    assert references_for(plain) == reference_rows(plain)
    assert references_for(plain)[0].plans is None
