"""graphs_reachable is judged by the spec (docs/spec.md §2.2 rule 3) over the graphs a rank's
start-up record says it captured, never by the `reached_by` the rank wrote beside them: a
record that claims a batch reaches a graph the spec cannot reach fails, and a saved run is
judged again from its labels alone."""

from __future__ import annotations

from dataclasses import replace

from aimed_steps import twin_configs
from hypothesis import given
from hypothesis import strategies as st
from property_reach import MIN_SHARE, reach_share
from record_builders import config, startup_records

from harness.check.startup import check_graphs_reachable
from harness.check.verdict import Outcome
from harness.config import CudaGraphMode, Guard, Twins
from harness.gen.strategies import configs
from harness.history.decision import GraphDescriptor, descriptor_of_label
from harness.history.records import GraphRecord, StartupRecord
from harness.spec.decision import reached
from harness.sut.step_plan import graph_table_for

TWIN = "FULL/32tok/32req/uct1/ub2"  # what record_builders' ranks capture: reachable


def with_graph(rec: StartupRecord, label: str, reached_by: int | None) -> StartupRecord:
    return replace(rec, graphs=(replace(rec.graphs[0], label=label, reached_by=reached_by),))


def test_a_graph_the_spec_cannot_reach_fails_whatever_batch_the_rank_claims_reaches_it():
    # Below the decode threshold of 8: no legal batch splits at 4 tokens.
    records = [with_graph(r, "FULL/4tok/4req/uct1/ub2", 4) for r in startup_records(2)]
    judged = check_graphs_reachable(records, config(2))
    assert judged.outcome is Outcome.FAILED
    assert judged.detail.startswith("rank 0: 1 graph(s) no legal batch can replay")
    assert "FULL/4tok/4req/uct1/ub2" in judged.detail


def test_a_reachable_graph_holds_though_the_rank_claims_no_batch_reaches_it():
    records = [with_graph(r, TWIN, None) for r in startup_records(2)]
    assert check_graphs_reachable(records, config(2)).outcome is Outcome.HELD


def test_the_same_graph_is_judged_by_the_config_it_ran_under():
    # Decode threshold 48 is above the graph's 32 tokens: now no batch splits into it.
    records = startup_records(2)
    assert check_graphs_reachable(records, config(2)).outcome is Outcome.HELD
    raised = config(2).with_changes(decode_threshold=48, prefill_threshold=48)
    assert check_graphs_reachable(records, raised).outcome is Outcome.FAILED


def test_a_label_that_names_no_descriptor_fails_naming_the_rank():
    records = startup_records(2)
    records[1] = with_graph(records[1], "FULL/32tok/ub2/32req", 32)
    judged = check_graphs_reachable(records, config(2))
    assert judged.outcome is Outcome.FAILED
    assert judged.detail == ("rank 1: graph label 'FULL/32tok/ub2/32req' is not as a "
                             "descriptor writes it")


descriptors = st.builds(
    GraphDescriptor, st.sampled_from(list(CudaGraphMode)[:3]), st.integers(0, 4096),
    st.none() | st.integers(0, 512), st.none() | st.integers(1, 8),
    st.none() | st.integers(1, 8), st.integers(1, 4))


@given(descriptors)
def test_a_label_reads_back_into_the_descriptor_that_wrote_it(desc):
    assert descriptor_of_label(desc.label()) == desc


def judged_as_the_rank_code_reaches(cfg) -> bool:
    """With every twin captured, the judge's reach and the rank code's own agree twin by twin
    (the judge never reads the rank's), and graphs_reachable fails exactly where a twin is
    unreachable; True: some twin was, so the failing side was asserted."""
    cfg = cfg.with_changes(twins=Twins.ALL)
    table = graph_table_for(cfg, 0)
    captured = [d for d in table.capture_order() if d.cg_mode is CudaGraphMode.FULL]
    for twin in table.twins:
        assert reached(cfg, captured, twin) == (table.reaching_batch_size(twin) is not None)
    records = [StartupRecord(0, (), tuple(GraphRecord(d.label(), d.num_ubatches, False, (), 0,
                                                      None) for d in captured),
                             None, (), False, 0.0)]
    unreachable = table.unreachable_twins()
    judged = check_graphs_reachable(records, cfg)
    assert judged.outcome is (Outcome.FAILED if unreachable else Outcome.HELD), judged.detail
    return bool(unreachable)


@st.composite
def request_short_configs(draw):
    """A FULL config whose request limit r divides a capture size m * r past the decode
    threshold: that size's mixed twin takes m >= 2 tokens a request, which no decode of one
    token reaches."""
    config = draw(configs(guards=tuple(Guard), modes=(CudaGraphMode.FULL,)))
    m = draw(st.integers(2, 4))
    top = config.serving.max_num_batched_tokens // m
    r = draw(st.integers(min(top, -(-config.serving.decode_threshold // m)), top))
    return config.with_changes(capture_sizes=tuple(sorted({*config.cudagraph_capture_sizes,
                                                           m * r})), max_num_reqs=r)


REACH_CONFIGS = st.one_of(twin_configs(tuple(Guard)), request_short_configs())


@given(REACH_CONFIGS)
def test_the_spec_over_the_captured_graphs_reaches_the_twins_the_rank_code_reaches(cfg):
    judged_as_the_rank_code_reaches(cfg)


def test_the_comparison_with_the_rank_code_sees_unreachable_twins_in_a_fifth_of_its_examples():
    share = reach_share(REACH_CONFIGS, judged_as_the_rank_code_reaches)
    assert share >= MIN_SHARE
