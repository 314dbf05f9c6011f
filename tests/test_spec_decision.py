"""The spec oracle (harness/spec/decision.py): it plans what the harness's decision code
plans with its planted bug undone, on every drawn config and skew; it carries no bug switch
(nothing under harness/spec reads the Mutation but the staging policy), so a planted decision
bug fails `spec_decision`; it alone catches slips that change no output row and no cross-rank
agreement; and it shares no code with the decision code."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from harness.batch import RankBatch
from harness.check.checkers import check_spec_decision
from harness.check.judge import judge
from harness.config import CudaGraphMode, Guard, HarnessConfig, Mutation, Twins
from harness.gen.strategies import configs, fuzz_configs, rank_batch, skewed_batches
from harness.history.records import StepRecord
from harness.scenario import scenario_from_dict
from harness.spec.decision import spec_plans, stages
from harness.sut import dp_sync
from harness.sut.step_plan import plan_without_world
from harness.timeouts import Timeouts
from harness.world.sim.world import SimWorld

ROOT = Path(__file__).resolve().parents[1]
ORACLE = ROOT / "harness" / "spec" / "decision.py"
FAST = Timeouts(collective_s=2.0, hang_s=4.0, step_deadline_s=15.0)
SMALL = {"capture_sizes": (16, 32), "max_num_reqs": 32, "max_num_batched_tokens": 64,
         "decode_threshold": 8, "prefill_threshold": 16}

# The planted decision bugs (docs/spec.md §7) the oracle must not model: drawn, so the
# harness plans with them and the oracle without. Staging is a serving policy (§3.4), no bug.
SWITCHES = {"guard": st.sampled_from(list(Guard)), "twins": st.sampled_from(list(Twins)),
            "threshold_offset_rank": st.one_of(st.none(), st.integers(0, 1)),
            "threshold_offset": st.integers(-4, 16),
            "query_len_bound": st.sampled_from(("synced", "rank-local")),
            "ubatch_vote": st.sampled_from(("synced", "rank-local")),
            "staging_vote": st.sampled_from(("synced", "rank-local"))}


def bug_undone(config: HarnessConfig) -> HarnessConfig:
    """The config with every planted switch back to the reference, the staging policy kept."""
    return replace(config, mutation=Mutation())


@st.composite
def wide_configs(draw) -> HarnessConfig:
    """The decision layer's wide configs with every switch drawn, microbatching sometimes
    off (where PIECEWISE and low thresholds are legal)."""
    config = draw(configs(guards=tuple(Guard)))
    changes = {"twins": draw(SWITCHES["twins"]), "staging": draw(st.integers(0, 3)) == 0}
    if draw(st.integers(0, 4)) == 0:
        changes.update(enable_dbo=False, ubatch_size=0,
                       cudagraph_mode=draw(st.sampled_from(list(CudaGraphMode))),
                       decode_threshold=draw(st.integers(0, 8)),
                       capture_sizes=draw(st.one_of(st.none(),
                                                    st.just(config.serving.capture_sizes))))
    elif draw(st.booleans()):
        changes.update(threshold_offset_rank=draw(st.integers(0, config.serving.dp_size - 1)),
                       threshold_offset=draw(st.integers(0, 16)))
    if draw(st.integers(0, 5)) == 0:
        changes["capture_sizes"] = None  # the default ladder of §0.3
    return config.with_changes(**changes)


@st.composite
def decision_steps(draw):
    """A config (the fuzzer's space or the wide one) and one batch per rank, from a skew
    shape or each rank on its own."""
    # One fuzz config in four has draft tokens (docs/spec.md §1.6).
    config = draw(st.one_of(fuzz_configs(drawn=SWITCHES, drafts_every=4), wide_configs()))
    if draw(st.booleans()):
        batches = draw(skewed_batches(config))
    else:
        batches = [draw(rank_batch(config)) for _ in range(config.serving.dp_size)]
    return config, batches


@settings(max_examples=400, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(decision_steps())
# docs/spec.md §7.9: rank 1 lacks the 16 twin, so it splits eagerly where rank 0 replays.
@example((HarnessConfig.of(**SMALL, threshold_offset_rank=1, threshold_offset=16),
          [RankBatch.uniform(10, 1), RankBatch.uniform(12, 1)]))
# §3.3: k = 3, G = 96, min 50 replays under both literal-2 guards, eager under `fixed`.
@example((HarnessConfig.of(ubatch_size=3, enable_dbo=False, capture_sizes=(96,),
                           max_num_reqs=96, max_num_batched_tokens=96, decode_threshold=8,
                           guard=Guard.STRICT_K2),
          [RankBatch.uniform(50, 1), RankBatch.uniform(96, 1)]))
# §7.1: 2 * min = G replays under `merged` alone.
@example((HarnessConfig.of(**SMALL, guard=Guard.MERGED),
          [RankBatch.uniform(16, 1), RankBatch.uniform(32, 1)]))
def test_the_oracle_plans_what_the_harness_plans_with_its_planted_bug_undone(step):
    config, batches = step
    assert spec_plans(config, batches) == plan_without_world(bug_undone(config), batches)


# -- planted decision bugs: in the system under test alone -----------------------------------

UNIFORM, LENS = RankBatch.uniform, RankBatch.from_query_lens
DRAFTS = {"enable_dbo": False, "decode_query_len": 3, "varlen_decode": True,
          "cudagraph_mode": "FULL_AND_PIECEWISE", "capture_sizes": (8, 16), "max_num_reqs": 8,
          "max_num_batched_tokens": 64}
# Per decision switch of harness/bug_switches.py, a step whose decision the bug changes.
PLANTED = {
    # §7.1: 2 * min = G, the merged guard replays rank 0's empty second region.
    "guard merged": ({**SMALL, "guard": "merged"}, [UNIFORM(16, 1), UNIFORM(32, 1)]),
    # §3.3: k = 3, G = 96, min 50 leaves the third region empty under the literal 2.
    "guard strict-k2": ({"ubatch_size": 3, "enable_dbo": False, "capture_sizes": (96,),
                         "max_num_reqs": 96, "max_num_batched_tokens": 96,
                         "decode_threshold": 8, "guard": "strict-k2"},
                        [UNIFORM(50, 1), UNIFORM(96, 1)]),
    # §7.5: the unreachable twin of 16 two-token requests is captured, so it is replayed.
    "twins all": ({**SMALL, "twins": "all", "max_num_reqs": 16, "prefill_threshold": 8},
                  [UNIFORM(32, 2), UNIFORM(32, 2)]),
    # §7.9: rank 1 lacks the 32 twin and splits eagerly where rank 0 replays it.
    "threshold offset": ({**SMALL, "threshold_offset_rank": 1, "threshold_offset": 16},
                         [UNIFORM(10, 1), UNIFORM(12, 1)]),
    # §7.15: rank 0 (one request, k = 2) leaves the split on its own.
    "ubatch_vote rank-local": ({**SMALL, "ubatch_vote": "rank-local", "prefill_threshold": 8},
                               [LENS([8]), LENS([4, 4])]),
    # §7.17: the decode rank dispatches with its own bound to the varlen graph.
    "query_len_bound rank-local": ({**DRAFTS, "query_len_bound": "rank-local"},
                                   [LENS([1, 3, 2], decode_query_len=3),
                                    LENS([5, 1], decode_query_len=3)]),
    # §3.4: rank 1 (12 of 16, its last region filled) keeps the fixed guard and runs eagerly.
    "staging_vote rank-local": ({**SMALL, "staging": True, "staging_vote": "rank-local",
                                 "decode_threshold": 4}, [UNIFORM(5, 1), UNIFORM(12, 1)]),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_the_oracle_plans_no_planted_decision_bug_so_spec_decision_fails_on_it(name):
    flat, batches = PLANTED[name]
    config = HarnessConfig.of(**flat)
    buggy, spec = plan_without_world(config, batches), spec_plans(config, batches)
    assert spec == plan_without_world(bug_undone(config), batches)
    assert buggy != spec
    assert not check_spec_decision(records_of(buggy), spec).ok
    assert check_spec_decision(records_of(spec), spec).ok


def records_of(plans) -> list[StepRecord]:
    """Records that carry a plan and nothing else, for the plan checkers."""
    return [StepRecord(rank=p.rank, step=0, plan=p, executed="replay", captured_split=(),
                       replay_split=(), fingerprint=(), routes=(), outputs=(), state=(),
                       threads_alive=(), pending_run=False, error=None, injected_fault=False,
                       seconds=0.0) for p in plans]


def test_the_merged_guard_at_twice_min_equal_to_g_fails_spec_decision_on_a_world():
    # docs/spec.md §7.1: [16, 32] on G = 32 replays the twin with rank 0's region 2 empty;
    # the oracle keeps the fixed guard and splits eagerly.
    result = judged({**SMALL, "guard": "merged"}, [{"tokens": 16}, {"tokens": 32}])
    assert {r.executed for r in result.steps[0].records} == {"replay"}
    failed = failing(result)
    assert failed["spec_decision"] == "rank 0: cg_mode: FULL (spec: NONE)"
    assert "no_empty_region" in failed


# -- slips that no checker but the oracle sees -------------------------------------------------

def slipped_decide(old: str, new: str):
    """dp_sync.decide_from_matrix with one source line changed: a slip no switch selects."""
    source = textwrap.dedent(inspect.getsource(dp_sync.decide_from_matrix))
    assert source.count(old) == 1, f"{old!r} is no longer in decide_from_matrix"
    namespace = dict(vars(dp_sync))
    exec(compile(source.replace(old, new), dp_sync.__file__, "exec"), namespace)
    return namespace["decide_from_matrix"]


def judged(config: dict, ranks: list):
    scenario = scenario_from_dict({"config": config, "steps": [{"ranks": ranks}]})
    with SimWorld(scenario.config.serving.dp_size, FAST) as world:
        return judge(world.run(scenario))


def failing(result) -> dict[str, str]:
    return {v.checker: v.detail for _, v in result.failed_verdicts()}


# Rank 0 (4 tokens) is below the decode threshold 8, so nobody splits (docs/spec.md §1.3,
# §3.1): every rank replays the unsplit 32-token graph.
BELOW_THRESHOLD = [{"tokens": 4}, {"tokens": 20}, {"tokens": 24}]
# Uniform decodes next to a mixed rank: no synced uniform token count (docs/spec.md §1.2).
DECODES_BESIDE_A_MIXED_RANK = [{"tokens": 6}, {"tokens": 5}, {"query_lens": [3, 5]}]


def test_the_sim_world_passes_every_checker_on_the_slip_scenarios_without_a_slip():
    for ranks in (BELOW_THRESHOLD, DECODES_BESIDE_A_MIXED_RANK):
        result = judged(SMALL, ranks)
        assert result.ok, result.failed_verdicts()
        assert "spec_decision" in {v.checker for v in result.steps[0].verdicts}


def test_a_threshold_tested_on_the_largest_rank_is_caught_by_the_oracle_alone(monkeypatch):
    monkeypatch.setattr(dp_sync, "decide_from_matrix",
                        slipped_decide("min_tokens = min(tokens)", "min_tokens = max(tokens)"))
    result = judged(SMALL, BELOW_THRESHOLD)
    # The slip splits eagerly (the guard sends 4 tokens to eager): the same rows on every
    # rank, the same decision everywhere, so only the oracle sees it.
    assert {r.executed for r in result.steps[0].records} == {"eager-microbatched"}
    assert failing(result) == {"spec_decision": "rank 0: cg_mode: NONE (spec: FULL)"}


def test_a_uniform_decode_count_synced_from_rank_0_alone_is_caught_by_the_oracle_alone(
        monkeypatch):
    slip = slipped_decide("ucts[0] != 0 and all(u == ucts[0] for u in ucts)", "ucts[0] != 0")
    monkeypatch.setattr(dp_sync, "decide_from_matrix", slip)
    result = judged(SMALL, DECODES_BESIDE_A_MIXED_RANK)
    assert {r.executed for r in result.steps[0].records} == {"replay"}
    assert failing(result) == {"spec_decision": "rank 0: synced uct: 1 (spec: None)"}


def test_a_slip_on_one_rank_only_is_named_on_that_rank(monkeypatch):
    # The last rank alone takes its own token count as everyone's: the ranks then disagree,
    # and the oracle names that rank (agreement sees the disagreement too).
    original = dp_sync.decide_from_matrix

    def last_rank_slips(config, table, rows, batch):
        decision = original(config, table, rows, batch)
        if batch.num_tokens == 24 and decision.state is not None:
            state = replace(decision.state, num_tokens_across_dp=(24,) * 3)
            return replace(decision, state=state)
        return decision

    monkeypatch.setattr(dp_sync, "decide_from_matrix", last_rank_slips)
    result = judged(SMALL, BELOW_THRESHOLD)
    assert failing(result)["spec_decision"] == ("rank 2: tokens_across_dp: (24, 24, 24) "
                                                "(spec: (32, 32, 32))")


# -- independence ----------------------------------------------------------------------------

# harness.spec.capture: the oracle's own sizes and lengths, split off for its size.
ALLOWED = {"harness.config", "harness.batch", "harness.history.decision", "harness.spec.capture"}


def harness_imports(path: Path) -> set[str]:
    """Every harness module a file imports, lazy imports included (ast, not execution)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {name for name in found if name == "harness" or name.startswith("harness.")}


def module_file(name: str) -> Path | None:
    base = ROOT / Path(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def decision_code_reached(names: list[str]) -> list[str]:
    """The modules of harness/sut and harness/vllm_sut that `names` import, at any depth."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen or module_file(name) is None:
            continue
        seen.add(name)
        todo.extend(harness_imports(module_file(name)))
    return sorted(m for m in seen if m.split(".")[1] in ("sut", "vllm_sut"))


def test_the_oracle_imports_neither_the_harness_decision_code_nor_vllms():
    direct = {m for m in harness_imports(ORACLE) if module_file(m) is not None}
    assert direct <= ALLOWED, sorted(direct - ALLOWED)
    assert decision_code_reached([*direct, "harness.spec"]) == []


def test_the_generator_aims_without_asking_the_decision_code_it_hunts_bugs_in():
    # Steering and fault aiming come from the oracle: a planted bug must not bend the search.
    generator = [f"harness.gen.{p.stem}" for p in (ROOT / "harness" / "gen").glob("*.py")]
    assert "harness.gen.aim" in generator and decision_code_reached(generator) == []
    assert decision_code_reached(["harness.report.decision_map"]) != []  # the walk sees sut


def test_importing_the_oracle_loads_no_decision_code():
    code = ("import sys, harness.spec.decision\n"
            "print(sorted(m for m in sys.modules if m.startswith(('harness.sut', "
            "'harness.vllm_sut'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]"


# The spec reads no field of the Mutation: every planted bug is the system under test's
# alone, and the staging policy (docs/spec.md §3.4) is a serving field.


def mutation_reads(root: Path) -> list[str]:
    """'file: function: expression' for every reference to the Mutation in a module under
    `root`: the attribute or a name `mutation`, the class, or the string (getattr)."""
    found: list[str] = []
    for path in sorted(root.glob("*.py")):
        source = path.read_text()
        _MutationReads(path.name, source, found).visit(ast.parse(source))
    return found


class _MutationReads(ast.NodeVisitor):
    def __init__(self, file: str, source: str, found: list[str]) -> None:
        self.file, self.source, self.found, self.where = file, source, found, "module"

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        outer, self.where = self.where, node.name
        self.generic_visit(node)
        self.where = outer

    def visit_Attribute(self, node: ast.Attribute) -> None:
        # config.mutation.guard is named whole: which switch is read
        if node.attr == "mutation" or (isinstance(node.value, ast.Attribute)
                                       and node.value.attr == "mutation"):
            self._hit(node)
        else:
            self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in ("mutation", "Mutation"):
            self._hit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if node.value == "mutation":
            self._hit(node)

    def visit_alias(self, node: ast.alias) -> None:
        if node.name == "Mutation":
            self._hit(node)

    def _hit(self, node: ast.AST) -> None:
        self.found.append(f"{self.file}: {self.where}: "
                          f"{ast.get_source_segment(self.source, node)}")


def test_nothing_under_harness_spec_reads_the_mutation():
    assert mutation_reads(ROOT / "harness" / "spec") == []
    # The staging policy is read from the serving part, whatever guard is planted.
    assert [g for g in Guard if stages(HarnessConfig.of(guard=g))] == []
    assert all(stages(HarnessConfig.of(guard=g, staging=True)) for g in Guard)


def test_a_spec_module_that_reads_a_bug_switch_is_refused(tmp_path):
    (tmp_path / "decision.py").write_text(
        "from harness.config import Mutation\n"
        "def stages(config):\n    return config.mutation.guard is Guard.STAGED\n"
        "def graph_table(config):\n    return config.mutation.twins\n")
    (tmp_path / "capture.py").write_text(
        "def sizes(config):\n    return getattr(config, 'mutation').guard\n")
    assert mutation_reads(tmp_path) == [
        "capture.py: sizes: 'mutation'",
        "decision.py: module: Mutation",
        "decision.py: stages: config.mutation.guard",
        "decision.py: graph_table: config.mutation.twins"]
