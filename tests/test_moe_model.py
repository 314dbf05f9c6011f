"""The miniature MoE step against its single-process reference, on thread-rank gloo worlds."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
import torch
from op_log import OpLog

from harness.config import HarnessConfig
from harness.model.mini_moe import MiniMoE
from harness.model.reference import diff_against_reference, reference_step
from harness.model.state import RequestSpec, StateCache
from harness.model.step_buffers import Microbatch, StepBuffers, UbatchMetadata, prepare_microbatch
from harness.model.ubatch_slice import UbatchSlice
from harness.model.weights import DEFAULT_VOCAB, MoEWeights
from harness.runtime.comm import CollectiveTimeout, EagerAllToAll
from harness.runtime.overlap import MicrobatchOverlap, NoOverlap
from harness.runtime.process_group import as_process_group
from harness.sut.slicing import clamped_ubatch_slices
from harness.world.sim.threads import RankFailure, ThreadWorld

TIMEOUT_S = 5.0
NUM_SLOTS = 8
HIDDEN = 8

# Skewed batches with mixed query lengths: rank 0 has 3 tokens, rank 1 has 17, and rank 1's
# fourth request (tokens 7..13) straddles the 2-microbatch split at 10 of 20 padded tokens.
LENS_2 = ([1, 2], [1, 5, 1, 7, 3])
LENS_3 = ([2], [4, 1, 1, 3, 6], [1, 1, 1, 1, 1])


def config_for(dp_size: int, seed: int = 0) -> HarnessConfig:
    return HarnessConfig.of(dp_size=dp_size, hidden_size=HIDDEN, experts_per_rank=2, top_k=2,
                            seed=seed)


def make_batches(lens_per_rank: Sequence[Sequence[int]], seed: int = 1
                 ) -> list[list[RequestSpec]]:
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for lens in lens_per_rank:
        slots = torch.randperm(NUM_SLOTS, generator=gen)[:len(lens)].tolist()
        requests = []
        for slot, n in zip(slots, lens, strict=True):
            context = 0 if n > 1 else int(torch.randint(1, 9, (1,), generator=gen))
            ids = torch.randint(0, DEFAULT_VOCAB, (n,), generator=gen).tolist()
            requests.append(RequestSpec(slot, context, tuple(ids)))
        batches.append(requests)
    return batches


def initial_states(dp_size: int, seed: int = 2) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    states = []
    for _ in range(dp_size):
        state = torch.randn(NUM_SLOTS + 1, HIDDEN, generator=gen, dtype=torch.float64)
        state[NUM_SLOTS] = 0.0  # the scratch slot
        states.append(state)
    return states


@dataclass
class RankResult:
    output: torch.Tensor
    state: torch.Tensor
    routes: Counter


def run_in_sequence(model: MiniMoE, step: StepBuffers, cache: StateCache,
                    slices: Sequence[UbatchSlice], metas: Sequence[UbatchMetadata]) -> None:
    """The step's microbatches one after another, each with its own metadata and comm buffers
    (NoOverlap per microbatch): the sequential stand-in for the thread protocol."""
    for i, sl in enumerate(slices):
        model.forward(prepare_microbatch(step, metas[i], sl, ubatch_id=i), cache, NoOverlap(i))


MicrobatchHook = Callable[[int, int, StepBuffers, UbatchSlice, Microbatch], Microbatch]


def run_world(config: HarnessConfig, batches, states, num_tokens: int = 20, num_reqs: int = 6,
              num_ubatches: int = 1, pad: tuple[int, int] = (0, 0),
              slices_hook: Callable[[int, tuple[UbatchSlice, ...]], tuple] | None = None,
              mb_hook: MicrobatchHook | None = None) -> list[RankResult]:
    """One eager step on every rank; microbatches run one after another (NoOverlap each)."""

    def rank_body(rank: int, group) -> RankResult:
        model = MiniMoE(config, rank, EagerAllToAll(as_process_group(group), TIMEOUT_S))
        cache = StateCache(NUM_SLOTS, HIDDEN)
        cache.state.copy_(states[rank])
        step = StepBuffers(num_tokens, num_reqs, HIDDEN, cache.scratch_slot)
        step.fill(batches[rank], pad_token_id=pad[0], pad_position=pad[1])
        lens = [r.query_len for r in batches[rank]]
        slices = clamped_ubatch_slices(lens, num_tokens, num_reqs, num_ubatches)
        if slices_hook is not None:
            slices = slices_hook(rank, slices)
        metas = [UbatchMetadata(num_reqs) for _ in slices]
        if mb_hook is None:
            run_in_sequence(model, step, cache, slices, metas)
        else:
            for i, sl in enumerate(slices):
                mb = mb_hook(rank, i, step, sl, prepare_microbatch(step, metas[i], sl, i))
                model.forward(mb, cache, NoOverlap(i))
        routes = Counter(route for i, sl in enumerate(slices)
                         for route in model.received_routes(i, sl.num_tokens))
        return RankResult(step.output.clone(), cache.state.clone(), routes)

    with ThreadWorld(config.serving.dp_size, timeout_s=TIMEOUT_S) as world:
        return world.run(rank_body, deadline_s=TIMEOUT_S + 5.0)


def mismatches(config, batches, states, results: Sequence[RankResult]) -> list[str]:
    ref = reference_step(config, MoEWeights.build(config), batches, states)
    return diff_against_reference(ref, [r.output for r in results], [r.state for r in results])


def test_weights_are_identical_for_one_seed_and_differ_for_another():
    a, b = MoEWeights.build(config_for(2)), MoEWeights.build(config_for(2))
    c = MoEWeights.build(config_for(2, seed=1))
    assert all(torch.equal(a.tensors()[k], b.tensors()[k]) for k in a.tensors())
    assert not torch.equal(a.router, c.router)


def test_no_overlap_runs_a_registered_hook_at_once_and_is_microbatch_zero():
    overlap = NoOverlap()
    ran = []
    overlap.register_recv_hook(lambda: ran.append(1))
    overlap.yield_()
    overlap.maybe_run_recv_hook()
    assert ran == [1] and overlap.current_ubatch_id() == 0
    assert isinstance(overlap, MicrobatchOverlap)


@pytest.mark.parametrize("lens", [LENS_2, LENS_3], ids=["2-ranks", "3-ranks"])
def test_an_eager_step_on_skewed_batches_matches_the_reference(lens):
    config, batches = config_for(len(lens)), make_batches(lens)
    states = initial_states(len(lens))
    results = run_world(config, batches, states)
    assert mismatches(config, batches, states, results) == []
    # The step did change state: a stale cache would not pass by accident.
    assert any(not torch.equal(r.state, s) for r, s in zip(results, states, strict=True))


def test_padding_tokens_change_no_real_row_and_no_state():
    config, batches, states = config_for(2), make_batches(LENS_2), initial_states(2)
    plain = run_world(config, batches, states, num_tokens=20, num_reqs=6)
    noisy = run_world(config, batches, states, num_tokens=32, num_reqs=9,
                      pad=(DEFAULT_VOCAB - 1, 1000))
    assert mismatches(config, batches, states, noisy) == []
    for rank, (a, b) in enumerate(zip(plain, noisy, strict=True)):
        n = sum(r.query_len for r in batches[rank])
        assert torch.allclose(a.output[:n], b.output[:n], atol=1e-12, rtol=0)
        assert torch.allclose(a.state[:NUM_SLOTS], b.state[:NUM_SLOTS], atol=1e-12, rtol=0)
        assert torch.equal(b.state[NUM_SLOTS], states[rank][NUM_SLOTS])  # scratch untouched


@pytest.mark.parametrize("num_ubatches", [1, 2, 3])
def test_every_received_row_is_a_route_the_reference_sends_there_exactly_once(num_ubatches):
    config, batches, states = config_for(2), make_batches(LENS_2), initial_states(2)
    results = run_world(config, batches, states, num_ubatches=num_ubatches)
    ref = reference_step(config, MoEWeights.build(config), batches, states)
    for rank, result in enumerate(results):
        assert result.routes == ref.routes[rank], f"rank {rank} received other rows"
    assert sum(ref.routes[0].values()) + sum(ref.routes[1].values()) == 20 * config.model.top_k


@pytest.mark.parametrize("num_ubatches", [2, 3])
def test_microbatches_run_in_sequence_give_the_same_step_as_one_batch(num_ubatches):
    config, batches, states = config_for(2), make_batches(LENS_2), initial_states(2)
    whole = run_world(config, batches, states)
    split = run_world(config, batches, states, num_ubatches=num_ubatches)
    assert mismatches(config, batches, states, split) == []
    for rank, (a, b) in enumerate(zip(whole, split, strict=True)):
        n = sum(r.query_len for r in batches[rank])
        assert torch.allclose(a.output[:n], b.output[:n], atol=1e-12, rtol=0)
        assert torch.allclose(a.state, b.state, atol=1e-12, rtol=0)


def _shift_second_request_slice(rank, slices):
    if rank != 1:
        return slices
    second = slices[1]
    return (slices[0], dataclasses.replace(second, req_start=second.req_start + 1))


def _stale_slot_view(rank, i, step, sl, mb):
    # Metadata written for the real split, slot view frozen one request off (as a replay of
    # a graph captured with another split would read it).
    if rank != 1 or i != 1:
        return mb
    return dataclasses.replace(mb, slot_ids=step.slot_ids[sl.req_start - 1:sl.req_stop - 1])


@pytest.mark.parametrize("hooks", [dict(slices_hook=_shift_second_request_slice),
                                   dict(mb_hook=_stale_slot_view)],
                         ids=["shifted-request-slice", "stale-slot-view"])
def test_a_wrong_request_split_corrupts_per_request_state_visibly(hooks):
    config, batches, states = config_for(2), make_batches(LENS_2), initial_states(2)
    results = run_world(config, batches, states, num_ubatches=2, **hooks)
    problems = mismatches(config, batches, states, results)
    assert any("rank 1: state slot" in p for p in problems), problems
    assert not any(p.startswith("rank 0") for p in problems), problems


def test_a_rank_that_skips_the_dispatch_makes_its_peer_fail_within_the_timeout():
    config = config_for(2)
    batches, states = make_batches(LENS_2), initial_states(2)

    def rank_body(rank: int, group):
        if rank == 1:
            return None
        model = MiniMoE(config, rank, EagerAllToAll(as_process_group(group), 1.0))
        cache = StateCache(NUM_SLOTS, HIDDEN)
        cache.state.copy_(states[rank])
        step = StepBuffers(20, 6, HIDDEN, cache.scratch_slot)
        step.fill(batches[rank])
        run_in_sequence(model, step, cache, [step.whole()], [UbatchMetadata(6)])

    with ThreadWorld(2, timeout_s=1.0) as world, pytest.raises(RankFailure) as info:
        world.run(rank_body, deadline_s=5.0)
    assert isinstance(info.value.errors[0], CollectiveTimeout)


def test_the_forward_has_no_host_sync_and_two_all_to_alls_per_microbatch():
    config, batches, states = config_for(2), make_batches(LENS_2), initial_states(2)

    def rank_body(rank: int, group) -> list[str]:
        model = MiniMoE(config, rank, EagerAllToAll(as_process_group(group), TIMEOUT_S))
        cache = StateCache(NUM_SLOTS, HIDDEN)
        cache.state.copy_(states[rank])
        step = StepBuffers(20, 6, HIDDEN, cache.scratch_slot)
        step.fill(batches[rank])
        lens = [r.query_len for r in batches[rank]]
        slices = clamped_ubatch_slices(lens, 20, 6, 2)
        metas = [UbatchMetadata(6) for _ in slices]
        for i, sl in enumerate(slices):
            model.reserve(i, sl.num_tokens)
        mbs = [prepare_microbatch(step, metas[i], sl, i) for i, sl in enumerate(slices)]
        with OpLog() as log:  # thread-local: sees only this rank's ops
            for mb in mbs:
                model.forward(mb, cache, NoOverlap(mb.ubatch_id))
        return log.ops

    # Every op goes through a Python dispatch mode here: slow on a loaded machine, so a
    # longer bound than the collectives' own.
    with ThreadWorld(2, timeout_s=TIMEOUT_S) as world:
        logs = world.run(rank_body, deadline_s=60.0)
    for ops in logs:
        assert not [op for op in ops if "_local_scalar_dense" in op or "nonzero" in op]
        assert sum("alltoall" in op for op in ops) == 4
