"""vLLM's own decision functions against the harness's miniature of them.

Skipped where vLLM does not import. Where vLLM 0.33.0 and the harness differ on purpose
(the guard bugs, twins nobody reaches, version drift) the test pins the difference.
"""

from __future__ import annotations

import difflib

import pytest
from vllm_releases import SHIPS_THE_KNOWN_BUGS, config_of, ships_the_known_bugs

from harness.batch import RankBatch
from harness.config import CudaGraphMode, HarnessConfig
from harness.sut.graph_table import GraphTable
from harness.sut.step_plan import decide_on_rank
from harness.vllm_sut.available import installed_release, unavailable_reason, vllm_version
from harness.world.sim.threads import ThreadWorld

if vllm_version() is None:
    pytest.skip(unavailable_reason(), allow_module_level=True)

from harness.vllm_sut.candidates import (
    vllm_capture_order,
    vllm_dispatch,
    vllm_dispatch_candidates,
)
from harness.vllm_sut.configs import vllm_configs
from harness.vllm_sut.step_plan import vllm_decide_on_rank
from harness.vllm_sut.sync import vllm_check_ubatch_thresholds

# The bug tests pin what 0.33.0 ships; another release may have fixed them.
known_bugs = pytest.mark.skipif(not ships_the_known_bugs(), reason=f"pins bugs that "
                                f"{SHIPS_THE_KNOWN_BUGS} ship, this is {vllm_version()}")

TIMEOUT_S = 2.0

# Configs whose candidates the two systems should generate identically (every twin kept).
SAME_CANDIDATES = {
    "full-k2": config_of(capture_sizes=(32, 64)),
    "full-k2-ladder": config_of(capture_sizes=(8, 16, 32, 64, 128), max_num_reqs=64,
                                       decode_threshold=16, prefill_threshold=64),
    "full-decode-only": config_of(cudagraph_mode="FULL_DECODE_ONLY",
                                         capture_sizes=(16, 32, 64)),
    "full-and-piecewise": config_of(cudagraph_mode="FULL_AND_PIECEWISE",
                                           capture_sizes=(16, 32, 64, 128)),
    "full-k3": config_of(enable_dbo=False, ubatch_size=3, capture_sizes=(12, 48, 96),
                                max_num_reqs=128, max_num_batched_tokens=128),
    "tiny-uct2-twin": config_of(capture_sizes=(4, 8), max_num_reqs=4,
                                       max_num_batched_tokens=8, decode_threshold=2,
                                       prefill_threshold=2),
    "no-ubatching": config_of(enable_dbo=False, capture_sizes=(16, 32)),
    "no-graphs": config_of(cudagraph_mode="NONE"),
}
# 0.34's speculative decoding under DBO: a fixed draft count, and a dynamic schedule whose
# batches above 4 requests draft one token instead of three.
DRAFTS_UNDER_DBO = {
    "drafts-dbo": dict(cudagraph_mode="FULL_DECODE_ONLY", decode_query_len=3,
                       capture_sizes=(6, 12, 24), max_num_reqs=8, decode_threshold=4,
                       prefill_threshold=16),
    "dynamic-drafts-k3": dict(cudagraph_mode="FULL_AND_PIECEWISE", decode_query_len=4,
                              draft_schedule=((4, 4), (2, 16)), enable_dbo=False, ubatch_size=3,
                              capture_sizes=(8, 16, 32), max_num_reqs=16, decode_threshold=4,
                              prefill_threshold=8),
}
if installed_release().spec_decode_with_dbo:
    SAME_CANDIDATES.update({name: config_of(**fields) for name, fields in DRAFTS_UNDER_DBO.items()})


def every_twin(config: HarnessConfig) -> HarnessConfig:
    return config.with_changes(twins="all")


def labels(descs) -> list[str]:
    return [d.label() for d in descs]


def diff(name_a: str, a: list[str], name_b: str, b: list[str]) -> str:
    return "\n".join(difflib.unified_diff(a, b, name_a, name_b, lineterm=""))


def plans(config: HarnessConfig, batches: list[RankBatch], decide) -> list:
    with ThreadWorld(config.serving.dp_size, timeout_s=TIMEOUT_S) as world:
        return world.run(lambda rank, group: decide(group, config, rank, batches[rank],
                                                    TIMEOUT_S))


def decode(tokens: int) -> RankBatch:
    return RankBatch.uniform(tokens)


def test_vllm_under_test_imports_and_names_its_version():
    assert vllm_version() is not None and unavailable_reason() == ""


@pytest.mark.parametrize("name", sorted(SAME_CANDIDATES))
def test_vllm_captures_the_graph_tables_descriptors_in_the_same_order(name):
    config = every_twin(SAME_CANDIDATES[name])
    ours = labels(GraphTable.build(config).capture_order())
    theirs = labels(vllm_capture_order(config))
    assert theirs == ours, diff("harness", ours, "vllm", theirs)


def test_vllm_keeps_the_twins_that_the_reachable_graph_table_drops():
    config = config_of(capture_sizes=(16, 32, 64, 128), max_num_reqs=64)
    reachable_only = set(GraphTable.build(config).descriptors)
    theirs = set(vllm_capture_order(config))
    extra = theirs - reachable_only
    print("vllm captures, harness drops:", sorted(d.label() for d in extra))
    assert extra == set(GraphTable.build(every_twin(config)).unreachable_twins())
    assert {d.label() for d in extra} == {"FULL/128tok/64req/uct2/ub2"}
    assert reachable_only <= theirs


@known_bugs
def test_vllm_0_33_adds_max_num_seqs_to_the_default_capture_ladder():
    config = config_of(max_num_reqs=100, max_num_batched_tokens=512)
    ours = list(config.cudagraph_capture_sizes)
    theirs = list(vllm_configs(config).compilation_config.cudagraph_capture_sizes)
    print(diff("harness", [str(s) for s in ours], "vllm", [str(s) for s in theirs]))
    assert sorted(set(theirs) - set(ours)) == [100] and set(ours) <= set(theirs)


@pytest.mark.parametrize("name", ["full-k2-ladder", "full-decode-only", "full-and-piecewise",
                                  "full-k3", "no-ubatching"])
def test_vllm_dispatches_every_batch_the_dp_sync_can_send_like_the_graph_table(name):
    config = every_twin(SAME_CANDIDATES[name])
    table = GraphTable.build(config)
    k = config.num_ubatches
    mismatches = []
    for tokens in range(1, config.serving.max_num_batched_tokens + 1):
        batches = [(min(tokens, config.serving.max_num_reqs), None)]  # mixed: one request or more
        if tokens <= config.serving.max_num_reqs:
            batches.append((tokens, 1))  # uniform decode
        for (reqs, uct) in batches:
            # The sync asks for k microbatches only once the smallest rank meets a threshold.
            s = config.serving
            threshold = s.decode_threshold if uct == 1 else s.prefill_threshold
            for ubatches in sorted({1, k} if tokens >= threshold else {1}):
                ours = table.dispatch(reqs, tokens, uct, num_ubatches=ubatches)
                theirs = vllm_dispatch(config, reqs, tokens, uct, num_ubatches=ubatches)
                if ours != theirs:
                    mismatches.append(f"tokens {tokens} reqs {reqs} uct {uct} ub {ubatches}: "
                                      f"harness {ours.label()}, vllm {theirs.label()}")
    assert not mismatches, "\n".join(mismatches[:20])


@pytest.mark.parametrize("name", sorted(DRAFTS_UNDER_DBO))
def test_vllm_dispatches_every_uniform_draft_batch_like_the_graph_table(name):
    if name not in SAME_CANDIDATES:
        pytest.skip(f"vLLM {vllm_version()} refuses speculative decoding with DBO")
    config = every_twin(SAME_CANDIDATES[name])
    table, k, s = GraphTable.build(config), config.num_ubatches, config.serving
    mismatches = []
    for length in range(1, s.decode_query_len + 1):
        for reqs in range(1, s.max_num_reqs + 1):
            tokens = reqs * length
            for ubatches in (1, k):
                ours = table.dispatch(reqs, tokens, length, num_ubatches=ubatches)
                theirs = vllm_dispatch(config, reqs, tokens, length, num_ubatches=ubatches)
                if ours != theirs:
                    mismatches.append(f"{reqs} x {length} tokens, ub {ubatches}: harness "
                                      f"{ours.label()}, vllm {theirs.label()}")
    assert not mismatches, "\n".join(mismatches[:20])


def test_vllm_dispatch_never_looks_past_the_smallest_graph_that_fits():
    # vLLM keys its candidates by token count and lists only the smallest size that fits
    # (per mode); the graph table tries every larger size as well. Two batches show it:
    # one below the decode threshold (no twin at 8 tokens, one at 16) and a uct-2 batch
    # (no uct-2 twin at 4 tokens, one at 8). The DP sync never sends the first (its
    # smallest rank would have to meet the threshold) and needs speculative decoding for
    # the second, so neither changes a step; both change what dispatch answers.
    ladder = every_twin(SAME_CANDIDATES["full-k2-ladder"])
    assert labels(vllm_dispatch_candidates(ladder, 8)) == ["FULL/8tok/8req"]
    assert GraphTable.build(ladder).dispatch(8, 8, 1, num_ubatches=2).label() == (
        "FULL/16tok/16req/uct1/ub2")
    assert vllm_dispatch(ladder, 8, 8, 1, num_ubatches=2).label() == "NONE/8tok/8req/ub2"

    tiny = every_twin(SAME_CANDIDATES["tiny-uct2-twin"])
    # 0.33 lists the twin first, 0.34 the base; the graph's microbatch count tells them apart.
    assert sorted(labels(vllm_dispatch_candidates(tiny, 4))) == [
        "FULL/4tok/4req", "FULL/4tok/4req/uct1/ub2"]
    assert GraphTable.build(tiny).dispatch(2, 4, 2, num_ubatches=2).label() == (
        "FULL/8tok/4req/uct2/ub2")
    assert vllm_dispatch(tiny, 2, 4, 2, num_ubatches=2).label() == "NONE/4tok/2req/ub2"


def test_vllm_thresholds_are_the_harness_thresholds():
    config = config_of(decode_threshold=32, prefill_threshold=128)
    for tokens in range(0, 200):
        for uniform in (True, False):
            ours = tokens >= (32 if uniform else 128)
            assert vllm_check_ubatch_thresholds(config, tokens, uniform) == ours, tokens


SKEW_CONFIG = config_of(capture_sizes=(16, 32, 64, 128), max_num_reqs=128,
                               max_num_batched_tokens=256, decode_threshold=32,
                               prefill_threshold=128)
COUNTS = (0, 1, 15, 16, 17, 31, 32, 33, 40, 63, 64, 65, 100, 127, 128)


def skews():
    """Decode skews, a mixed rank, a rank that will not microbatch, and prefill-sized steps."""
    for a in COUNTS:
        for b in COUNTS:
            yield [decode(a), decode(b)]
    for a, b in [(40, 64), (64, 64), (100, 128), (128, 128), (33, 33)]:
        yield [decode(a), RankBatch.uniform(b, None, num_reqs=max(1, b // 4))]
        yield [decode(a), RankBatch.uniform(b, allow_ubatching=False)]
    for a, b in [(129, 200), (200, 256), (150, 150), (64, 256)]:
        yield [RankBatch.uniform(a, None, num_reqs=a // 8),
               RankBatch.uniform(b, None, num_reqs=b // 8)]


def test_vllm_and_the_fixed_reference_agree_wherever_the_guard_variants_agree():
    fixed = SKEW_CONFIG
    merged = SKEW_CONFIG.with_changes(guard="merged")
    compared, mismatches, request_counts = 0, [], []
    with ThreadWorld(2, timeout_s=TIMEOUT_S) as world:
        def run(config, decide, batches):
            return world.run(lambda rank, group: decide(group, config, rank, batches[rank],
                                                        TIMEOUT_S))
        for batches in skews():
            ours = run(fixed, decide_on_rank, batches)
            if [p.desc for p in run(merged, decide_on_rank, batches)] != [p.desc for p in ours]:
                continue  # the guard boundary: pinned by the guard-bug tests below
            theirs = run(fixed, vllm_decide_on_rank, batches)
            compared += 1
            tokens = [b.num_tokens for b in batches]
            for o, t in zip(ours, theirs, strict=True):
                fields = {
                    "desc": (o.desc, t.desc),
                    "num_tokens": (o.num_tokens, t.num_tokens),
                    "num_reqs": (o.num_reqs, t.num_reqs),
                    "regions": (o.regions, t.regions),
                    "state is None": (o.state is None, t.state is None),
                }
                if o.state is not None and t.state is not None:
                    fields.update({
                        "num_tokens_across_dp": (o.state.num_tokens_across_dp,
                                                 t.state.num_tokens_across_dp),
                        "uniform_token_count": (o.state.uniform_token_count,
                                                t.state.uniform_token_count),
                        "eager": (o.state.eager, t.state.eager),
                    })
                    if o.state.num_reqs != t.state.num_reqs:
                        request_counts.append((tokens, o, t))
                for field, (a, b) in fields.items():
                    if a != b:
                        mismatches.append(f"{tokens} rank {o.rank} {field}: harness {a}, "
                                          f"vllm {b}")
    assert compared > 200
    assert not mismatches, "\n".join(mismatches[:30])
    # The one field that differs: see the test below.
    for _, o, t in request_counts:
        assert o.desc.cg_mode is CudaGraphMode.FULL and o.state.num_reqs == o.desc.num_reqs
        assert t.state.num_reqs < o.state.num_reqs


@known_bugs
def test_vllm_0_33_syncs_the_real_request_count_where_the_harness_syncs_the_graphs():
    # Below the decode threshold: no microbatching, both ranks replay the 32-token graph.
    batches = [decode(20), decode(24)]
    ours = plans(SKEW_CONFIG, batches, decide_on_rank)
    theirs = plans(SKEW_CONFIG, batches, vllm_decide_on_rank)
    assert [p.desc.label() for p in theirs] == ["FULL/32tok/32req"] * 2
    assert [p.desc for p in ours] == [p.desc for p in theirs]
    assert {p.state.num_reqs for p in ours} == {32}  # the graph's request count
    assert {p.state.num_reqs for p in theirs} == {24}  # the most real requests on a rank


@known_bugs
def test_vllm_0_33_replays_a_microbatched_graph_when_the_smallest_rank_fills_exactly_half():
    config = config_of(capture_sizes=(32, 64), max_num_reqs=64)
    batches = [decode(32), decode(64)]
    theirs = plans(config, batches, vllm_decide_on_rank)
    merged = plans(config.with_changes(guard="merged"), batches, decide_on_rank)
    fixed = plans(config, batches, decide_on_rank)
    assert [p.desc.label() for p in theirs] == ["FULL/64tok/64req/uct1/ub2"] * 2
    assert [p.desc for p in merged] == [p.desc for p in theirs]
    assert [p.kind for p in fixed] == ["eager-microbatched"] * 2
    # Rank 0's second microbatch region holds no real token, yet the graph replays.
    assert [(r.tokens, r.real_tokens) for r in theirs[0].regions] == [(32, 32), (32, 0)]


@known_bugs
def test_vllm_0_33_keeps_the_literal_two_of_the_guard_with_three_microbatches():
    config = config_of(enable_dbo=False, ubatch_size=3, capture_sizes=(96,),
                              max_num_reqs=128, max_num_batched_tokens=128)
    assert vllm_configs(config).num_ubatches == 3
    replays_with_an_empty_region = []
    for smallest in range(40, 71):
        batches = [decode(smallest), decode(96)]
        theirs = plans(config, batches, vllm_decide_on_rank)
        merged = plans(config.with_changes(guard="merged"), batches, decide_on_rank)
        strict = plans(config.with_changes(guard="strict-k2"), batches, decide_on_rank)
        fixed = plans(config, batches, decide_on_rank)
        assert [p.desc for p in theirs] == [p.desc for p in merged], smallest
        if smallest != 48:  # `<=` with the literal 2 only moves the boundary by one
            assert [p.desc for p in theirs] == [p.desc for p in strict], smallest
        if theirs[0].kind == "full-microbatched" and fixed[0].kind != "full-microbatched":
            assert theirs[0].regions[-1].real_tokens == 0
            replays_with_an_empty_region.append(smallest)
    # Regions [0,32) [32,64) [64,96): any smallest rank in 48..64 leaves the last one empty.
    assert replays_with_an_empty_region == list(range(48, 65))


def test_vllm_sync_agrees_with_the_merged_guard_on_a_three_rank_world():
    # Three ranks take vLLM's all-reduce through its non-power-of-two exchange.
    config = config_of(dp_size=3, capture_sizes=(32, 64, 128), max_num_reqs=128)
    merged = config.with_changes(guard="merged")
    for tokens in ([32, 64, 64], [40, 33, 100], [64, 128, 70], [0, 5, 31], [128, 128, 128]):
        batches = [decode(n) for n in tokens]
        theirs = plans(config, batches, vllm_decide_on_rank)
        ours = plans(merged, batches, decide_on_rank)
        assert [p.desc for p in theirs] == [p.desc for p in ours], tokens
        assert [p.regions for p in theirs] == [p.regions for p in ours], tokens
