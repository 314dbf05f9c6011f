"""A search bounded by time alone runs in rounds (harness/fuzz/engine.py, `_rounds`): each
round a Hypothesis run of ROUND_EXAMPLES under its own seed, so that Hypothesis's
hill-climbing of the steering targets, given up to half of a run's examples, never takes over
the rest of the budget; a round that runs nothing new ends the search as exhausted."""

from __future__ import annotations

import harness.fuzz.engine as engine
import harness.fuzz.search_state as search_state
from harness.fuzz.engine import FUZZ_TIMEOUTS, Budget, fuzz
from harness.fuzz.variants import VARIANTS
from harness.world.sim.world import SimWorld


def _reference_search(monkeypatch, tmp_path, round_examples: int, budget: Budget, **options):
    """The reference search on the sim world in rounds of `round_examples`; its outcome and
    the seed each Hypothesis run was given."""
    monkeypatch.setattr(search_state, "ROUND_EXAMPLES", round_examples)
    seeds = []
    test_of = engine._hypothesis_test

    def recorded(search, strategy, profile, db, seed):
        seeds.append(seed)
        return test_of(search, strategy, profile, db, seed)

    monkeypatch.setattr(engine, "_hypothesis_test", recorded)
    with SimWorld(2, FUZZ_TIMEOUTS) as sim:
        outcome = fuzz(VARIANTS["reference"], sim.run, world="sim", dp_sizes=(2,),
                       budget=budget, database=None, scenario_dir=tmp_path, **options)
    return outcome, seeds


def test_a_search_bounded_by_time_draws_afresh_each_round_under_its_own_seed(monkeypatch,
                                                                              tmp_path):
    # Rounds of 5: a loaded 2-core machine ran 16-17 examples of this seed in 6 s, so rounds
    # of 15 left one example of room.
    outcome, seeds = _reference_search(monkeypatch, tmp_path, 5, Budget(seconds=6.0), seed=7)
    assert not outcome.found and outcome.note == "budget spent"
    assert outcome.examples > 5 and len(seeds) >= 2
    assert seeds[:2] == [7, 7 + 2**32] and len(set(seeds)) == len(seeds)


def test_an_unseeded_search_under_the_ci_profile_goes_on_past_its_first_round(monkeypatch,
                                                                               tmp_path):
    outcome, seeds = _reference_search(monkeypatch, tmp_path, 5, Budget(seconds=6.0),
                                       profile="ci")
    assert outcome.note == "budget spent" and outcome.examples > 5
    assert seeds[:2] == [None, 2**32]


def test_a_search_bounded_by_examples_is_one_run_of_that_many(monkeypatch, tmp_path):
    outcome, seeds = _reference_search(monkeypatch, tmp_path, 5,
                                       Budget(examples=12, seconds=60.0), seed=7)
    assert seeds == [7] and outcome.examples <= 12  # redraws are judged from the memo


def test_a_round_that_runs_nothing_new_ends_the_search_as_exhausted(monkeypatch, tmp_path):
    calls = []

    def draws_nothing(search, strategy, profile, db, seed):
        return lambda: calls.append(seed)  # a run whose every draw was judged before

    monkeypatch.setattr(engine, "_hypothesis_test", draws_nothing)
    outcome = fuzz(VARIANTS["reference"], lambda scenario: None, world="sim", dp_sizes=(2,),
                   budget=Budget(seconds=60.0), database=None, seed=3, scenario_dir=tmp_path)
    assert calls == [3] and not outcome.found and outcome.note == "examples exhausted"


def test_unseeded_rounds_draw_at_random_and_under_a_derandomizing_profile_apart():
    assert [engine._round_seed(None, r, derandomized=False) for r in range(3)] == [None] * 3
    assert [engine._round_seed(None, r, derandomized=True) for r in range(3)] == [
        None, 2**32, 2 * 2**32]  # else each round would redraw the first's examples
    assert engine._round_seed(9, 2, derandomized=False) == 9 + 2 * 2**32
