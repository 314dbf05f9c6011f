"""A scenario: everything needed to replay one case, as plain data (JSON or TOML).

    {"name": ..., "config": {...HarnessConfig fields...},
     "steps": [{"ranks": [{"query_lens": [1, 1, 1]}, {"tokens": 64, "allow_ubatching": false}]}],
     "faults": [{"kind": "raise_in_ubatch", "rank": 0, "step": 0, "ubatch": 0}],
     "expect": {"caught_by": "checker name", "caught_by_on": {"cuda": "other checker"}},
     "schedule": {"mode": "pct", "seed": 3}}

A rank is given by `query_lens` (one entry per request) or by `tokens` (that many one-token
decode requests); `{"tokens": 0}` is an idle rank: the wire form of harness/batch.py, read
once into the RankBatch every world and the reference are given. Request i of a rank keeps
state slot i across steps, so later steps continue the same requests. `caught_by` names the
checker that catches the bug on emulated graphs; `caught_by_on` names another per graph
backend where the real thing shows the bug elsewhere (a capture on the wrong stream fails
capture on CUDA outright, where the emulation records an empty graph). `schedule` (optional,
`os` when absent) is the controlled schedule every rank's microbatch threads run under
(docs/schedules.md): part of the case, so a replay runs the same interleavings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.batch import RankBatch, rank_fields, validate_batches
from harness.config import FLAT_FIELDS, Execution, HarnessConfig, config_kwargs
from harness.config_values import check_seconds
from harness.data_file import read_data_file
from harness.dead_ranks import check_deaths, steps_without_rank, with_silent_members
from harness.errors import ConfigError
from harness.faults import SLEEPING_FAULTS, VLLM_EXEC_FAULTS, Fault, FaultKind
from harness.invariants import CheckerName
from harness.model.state import RequestSpec
from harness.model.weights import DEFAULT_VOCAB
from harness.runtime.schedule.descriptor import OS_SCHEDULE, Schedule


@dataclass(frozen=True)
class Scenario:
    config: HarnessConfig
    steps: tuple[tuple[RankBatch, ...], ...]  # per step, what each rank is given
    faults: tuple[Fault, ...] = ()
    name: str = "scenario"
    description: str = ""
    caught_by: str | None = None  # the checker a regression scenario must trip
    # Per graph backend ("emulated", "cuda"), a checker other than `caught_by` that catches it.
    caught_by_on: tuple[tuple[str, str], ...] = ()
    # The config changes that turn the buggy variant back into the reference behaviour.
    reference_changes: tuple[tuple[str, Any], ...] = ()
    schedule: Schedule = OS_SCHEDULE  # how each rank's microbatch threads interleave

    def __post_init__(self) -> None:
        # A parsed or drawn scenario's ranks already fit its config and stay the same objects;
        # one built by hand (or a config change) gets its request layout bound once, here.
        q = self.config.serving.decode_query_len
        steps = tuple(tuple(r.given_to(q) for r in ranks) for ranks in self.steps)
        object.__setattr__(self, "steps", steps)

    def expected_checker(self, graphs: str) -> str | None:
        """The checker that must catch this scenario on the `graphs` backend."""
        return dict(self.caught_by_on).get(graphs, self.caught_by)

    def batches(self, step: int) -> list[RankBatch]:
        """What each rank is given at `step`: the objects the scenario holds, not copies."""
        return list(self.steps[step])

    def faults_at(self, step: int, rank: int) -> tuple[Fault, ...]:
        return tuple(f for f in self.faults if f.step == step and f.rank == rank)

    def requests(self) -> list[list[list[RequestSpec]]]:
        """Per step, per rank, the requests with their slots, context and token ids.

        Token ids are a pure function of (seed, rank, slot, position), so a rerun, the
        reference and every world see the same tokens.
        """
        context = [[0] * self.config.serving.max_num_reqs
                   for _ in range(self.config.serving.dp_size)]
        out = []
        for ranks in self.steps:
            per_rank = []
            for rank, rank_step in enumerate(ranks):
                reqs = []
                for slot, q in enumerate(rank_step.query_lens):
                    start = context[rank][slot]
                    ids = tuple(_token_id(self.config.model.seed, rank, slot, p)
                                for p in range(start, start + q))
                    reqs.append(RequestSpec(slot, start, ids))
                    context[rank][slot] = start + q
                per_rank.append(reqs)
            out.append(per_rank)
        return out

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name}
        if self.description:
            data["description"] = self.description
        data["config"] = self.config.to_dict()
        data["steps"] = [{"ranks": [r.to_dict() for r in ranks]} for ranks in self.steps]
        if self.faults:
            data["faults"] = [{"kind": f.kind.value, "rank": f.rank, "step": f.step,
                               "ubatch": f.ubatch, "seconds": f.seconds} for f in self.faults]
        if self.caught_by or self.reference_changes:
            data["expect"] = {"caught_by": self.caught_by,
                              "reference": dict(self.reference_changes)}
            if self.caught_by_on:
                data["expect"]["caught_by_on"] = dict(self.caught_by_on)
        if self.schedule.controlled:  # an `os` scenario reads as it always did
            data["schedule"] = self.schedule.to_json()
        return data

    def only_step(self, step: int) -> Scenario:
        """Step `step` alone (its requests start afresh), with its faults."""
        faults = tuple(replace(f, step=0) for f in self.faults if f.step == step)
        return replace(self, steps=(self.steps[step],), faults=faults)

    def without_rank(self, rank: int) -> Scenario:
        """The same case with `rank` left out of every step; later ranks move down by one."""
        data = self.to_dict()
        data["config"]["dp_size"] = self.config.serving.dp_size - 1
        offset_rank = data["config"].get("threshold_offset_rank")
        if offset_rank is not None and offset_rank > rank:
            data["config"]["threshold_offset_rank"] = offset_rank - 1
        elif offset_rank == rank:
            data["config"]["threshold_offset_rank"] = None
        config = HarnessConfig.of(**config_kwargs(data["config"]))
        steps = steps_without_rank(config, self.steps, rank)
        faults = tuple(replace(f, rank=f.rank - (f.rank > rank)) for f in self.faults
                       if f.rank != rank)
        return replace(self, config=config, steps=steps, faults=faults)

    def one_token_fewer(self, step: int, rank: int) -> Scenario | None:
        """`rank`'s batch at `step` one token shorter: its last request loses a token, or goes
        when it had one (a uniform decode stays one). None when the rank is idle there."""
        ranks = self.steps[step]
        lens = list(ranks[rank].query_lens)
        if not lens:
            return None
        if lens[-1] > 1:
            lens[-1] -= 1
        else:
            lens.pop()
        old = ranks[rank]
        shorter = RankBatch.from_query_lens(lens, old.allow_ubatching, old.decode_query_len,
                                            old.allow_skip_drafts, knows_dead=old.knows_dead)
        steps = list(self.steps)
        steps[step] = ranks[:rank] + (shorter,) + ranks[rank + 1:]
        return replace(self, steps=tuple(steps))

    def with_reference_behaviour(self) -> Scenario:
        """The same scenario with the variant switched back to the reference."""
        config = HarnessConfig.of(**{**self.config.to_dict(), **dict(self.reference_changes)})
        return replace(self, config=config, caught_by=None, caught_by_on=(),
                       reference_changes=())

    def to_json(self) -> str:
        """The file form: a vLLM patch is recorded by name and content hash, not its diff
        (the worlds' wire form, `to_dict`, carries the diff to every rank process)."""
        data = self.to_dict()
        if "vllm_patches" in data["config"]:
            data["config"]["vllm_patches"] = [p.to_dict(with_diff=False)
                                              for p in self.config.system.vllm_patches]
        return json.dumps(data, indent=2)


def _token_id(seed: int, rank: int, slot: int, position: int) -> int:
    return (seed * 7919 + rank * 104729 + slot * 1299709 + position * 15485863) % DEFAULT_VOCAB


def _int(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(where, f"must be an integer, got {value!r}")
    return value


def _fault_from_dict(data: Any, where: str, config: HarnessConfig, num_steps: int) -> Fault:
    if not isinstance(data, dict):
        raise ConfigError(where, "must be an object")
    unknown = set(data) - {"kind", "rank", "step", "ubatch", "seconds"}
    if unknown:
        raise ConfigError(f"{where}.{sorted(unknown)[0]}", "is not a fault field")
    try:
        kind = FaultKind(data.get("kind"))
    except ValueError:
        kinds = ", ".join(k.value for k in FaultKind)
        raise ConfigError(f"{where}.kind", f"unknown fault {data.get('kind')!r} (one of "
                          f"{kinds})") from None
    rank = _int(data.get("rank", 0), f"{where}.rank")
    step = _int(data.get("step", 0), f"{where}.step")
    ubatch = _int(data.get("ubatch", 0), f"{where}.ubatch")
    seconds = check_seconds(f"{where}.seconds", data.get("seconds", 0.0), zero_ok=True)
    if kind in VLLM_EXEC_FAULTS and config.system.execution is not Execution.VLLM:
        raise ConfigError(f"{where}.kind", f"{kind.value} is a stage of vLLM's microbatch "
                          "threads: it needs execution vllm (--exec vllm)")
    if seconds and kind not in SLEEPING_FAULTS:
        raise ConfigError(f"{where}.seconds", f"only slow_rank and slow_ubatch sleep; {kind.value} "
                          "would ignore it")
    if not 0 <= rank < config.serving.dp_size:
        raise ConfigError(f"{where}.rank", f"{rank} is outside dp_size={config.serving.dp_size}")
    if not 0 <= step < num_steps:
        raise ConfigError(f"{where}.step", f"{step} is outside the {num_steps} steps")
    if not 0 <= ubatch < max(config.num_ubatches, 1):
        raise ConfigError(f"{where}.ubatch", f"{ubatch} is outside the "
                          f"{config.num_ubatches} microbatches")
    return Fault(kind, rank, step, ubatch, float(seconds))


GRAPH_BACKENDS = ("emulated", "cuda")
# `expect` may name only a registered checker (harness/check/registry.py).
CHECKERS = tuple(CheckerName)


def _checker(value: Any, where: str) -> str:
    if not isinstance(value, str) or value not in CHECKERS:
        raise ConfigError(where, f"names no checker: {value!r} (one of {', '.join(CHECKERS)})")
    return value


def _caught_by_on(data: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(data, dict):
        raise ConfigError("expect.caught_by_on", "must be an object of graph backend: checker")
    for backend, checker in data.items():
        if backend not in GRAPH_BACKENDS:
            raise ConfigError(f"expect.caught_by_on.{backend}", "is not a graph backend (one "
                              f"of {', '.join(GRAPH_BACKENDS)})")
        _checker(checker, f"expect.caught_by_on.{backend}")
    return tuple(sorted(data.items()))


def scenario_from_dict(data: Any) -> Scenario:
    if not isinstance(data, dict):
        raise ConfigError("scenario", "must be an object with `config` and `steps`")
    unknown = set(data) - {"name", "description", "config", "steps", "faults", "expect",
                           "schedule"}
    if unknown:
        raise ConfigError(sorted(unknown)[0], "is not a scenario field")
    for key in ("name", "description"):
        if not isinstance(data.get(key, ""), str):
            raise ConfigError(key, f"must be a string, got {data[key]!r}")
    parsed = _rank_fields_of_steps(data.get("steps"))
    kwargs = config_kwargs(data.get("config", {}))
    kwargs.setdefault("dp_size", len(parsed[0]))
    config = HarnessConfig.of(**kwargs)
    steps = _built_steps(config, parsed)
    raw_faults = data.get("faults", [])
    if not isinstance(raw_faults, list):
        raise ConfigError("faults", "must be a list")
    faults = tuple(_fault_from_dict(f, f"faults[{i}]", config, len(steps))
                   for i, f in enumerate(raw_faults))
    expect = data.get("expect", {})
    caught_by, reference = _expectation(expect)
    scenario = Scenario(config, steps, faults, data.get("name", "scenario"),
                        data.get("description", ""), caught_by,
                        _caught_by_on(expect.get("caught_by_on", {})),
                        tuple(sorted(reference.items())), _schedule(data.get("schedule")))
    if reference:
        try:
            scenario.with_reference_behaviour()
        except ConfigError as exc:
            raise ConfigError(f"expect.reference.{exc.field}", exc.message) from None
    return scenario


def _schedule(data: Any) -> Schedule:
    if data is None:
        return OS_SCHEDULE
    schedule = Schedule.from_json(data)
    if schedule.choices is not None:
        raise ConfigError("schedule.choices", "every rank and step of a scenario runs its "
                          "seed; recorded choices replay one run (harness.runtime.schedule's "
                          "explore and run_once)")
    return schedule


def _rank_fields_of_steps(raw_steps: Any) -> list[list[dict[str, Any]]]:
    """Each step's ranks as checked fields; every step with the same number of ranks."""
    if not isinstance(raw_steps, list) or not raw_steps:
        raise ConfigError("steps", "must be a non-empty list")
    parsed = []
    for i, raw in enumerate(raw_steps):
        if isinstance(raw, dict) and set(raw) - {"ranks"}:
            raise ConfigError(f"steps[{i}].{sorted(set(raw) - {'ranks'})[0]}",
                              "is not a step field")
        ranks = raw.get("ranks") if isinstance(raw, dict) else raw
        if not isinstance(ranks, list) or not ranks:
            raise ConfigError(f"steps[{i}].ranks", "must be a non-empty list, one per rank")
        parsed.append([rank_fields(r, f"steps[{i}].ranks[{j}]") for j, r in enumerate(ranks)])
    if len({len(ranks) for ranks in parsed}) != 1:
        raise ConfigError("steps", "every step needs the same number of ranks")
    return parsed


def _built_steps(config: HarnessConfig, parsed) -> tuple[tuple[RankBatch, ...], ...]:
    steps = []
    for i, ranks in enumerate(parsed):
        # Each rank built once, here; `{"tokens": 10**12}` is refused before it is expanded.
        built = tuple(RankBatch.from_fields(r, config.serving.decode_query_len,
                                            config.serving.max_num_batched_tokens) for r in ranks)
        try:
            validate_batches(config, built)
        except ConfigError as exc:
            raise ConfigError(f"steps[{i}].{exc.field}", exc.message) from None
        steps.append(with_silent_members(built))
    check_deaths(config, steps)
    return tuple(steps)


def _expectation(expect: Any) -> tuple[str | None, dict[str, Any]]:
    """`expect`'s checker and reference fields, checked (caught_by_on is read apart)."""
    if not isinstance(expect, dict):
        raise ConfigError("expect", "must be an object")
    unknown = set(expect) - {"caught_by", "caught_by_on", "reference"}
    if unknown:
        raise ConfigError(f"expect.{sorted(unknown)[0]}", "is not an expect field")
    caught_by = expect.get("caught_by")
    if caught_by is not None:
        _checker(caught_by, "expect.caught_by")
    reference = expect.get("reference", {})
    if not isinstance(reference, dict):
        raise ConfigError("expect.reference", "must be an object of config fields")
    for key in reference:
        if key not in FLAT_FIELDS:
            raise ConfigError(f"expect.reference.{key}", "is not a config field")
    return caught_by, reference


def load_scenario(path: str | Path) -> Scenario:
    return scenario_from_dict(read_data_file(path, "scenario"))
