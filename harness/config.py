"""The harness configuration: one frozen object every rank builds identically, made of frozen
parts (harness/config_parts.py): `serving`, `model`, `mutation` (the planted bug) and `system`.

Its wire and file form is flat: field names follow vLLM's ParallelConfig / SchedulerConfig /
CompilationConfig where a field has a counterpart there (docs/spec.md §0), and `of`,
`with_changes`, `to_dict` and `from_dict` route each flat name to its part.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Any

from harness.bug_switches import CaptureOn, Guard, SwitchToCompute, Twins
from harness.config_parts import (
    DECISION,
    EXECUTION,
    PARSERS,
    PART_OF,
    PARTS,
    All2AllBackend,
    CudaGraphMode,
    DecisionSystem,
    Execution,
    Model,
    Mutation,
    Release,
    Serving,
    System,
    UbatchProtocol,
    wire_value,
)
from harness.config_values import (
    check_draft_schedule,
    check_fault_tolerance,
    check_spec_decoding,
    default_capture_sizes,
)
from harness.data_file import read_data_file
from harness.errors import ConfigError
from harness.vllm_code.source import check_vllm_code_fields

# Names other modules import from here: the parts' types and enums among them.
__all__ = ["All2AllBackend", "CaptureOn", "CudaGraphMode", "DecisionSystem", "Execution",
           "FLAT_FIELDS", "Guard", "HarnessConfig", "Model", "Mutation", "Release", "Serving",
           "SwitchToCompute", "System", "Twins", "UbatchProtocol", "config_kwargs",
           "default_capture_sizes", "load_config_file", "ubatching_fields"]

# The DP sync all-reduces token and request counts as int32, as vLLM does.
INT32_MAX = 2**31 - 1
# Every flat field, the names files, flags and error lines use.
FLAT_FIELDS = tuple(PART_OF)
_REFERENCE = Mutation()  # no mutation: the reference behaviour
# Slips planted in vLLM's execution code as the miniature drives it (docs/spec.md §11).
VLLM_EXECUTION_SWITCHES = ("switch_to_compute", "ids_gather_wait")
# Switches of the harness's own decisions and execution; vLLM's code brings its own.
HARNESS_DECISION_SWITCHES = Mutation.switches_of(DECISION)
HARNESS_EXECUTION_SWITCHES = Mutation.switches_of(EXECUTION)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class HarnessConfig:
    """Built from parts, or from flat fields with `of`; validated across parts."""

    serving: Serving = Serving()
    model: Model = Model()
    mutation: Mutation = Mutation()
    system: System = System()

    def __post_init__(self) -> None:
        self._validate()

    def __hash__(self) -> int:
        # Caches all over key on a config; hashing every field of its parts each time cost
        # about 10 us, several times per vLLM sync of the exhaustive mode. Kept per process.
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.serving, self.model, self.mutation, self.system))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict[str, Any]:
        # A hash is only good in the process that computed it (str hashes are salted).
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @classmethod
    def of(cls, **flat: Any) -> HarnessConfig:
        """A config from flat fields (the wire form's names), each routed to its part; the
        fields are parsed in one order, so the same input names the same field first."""
        unknown = next((name for name in flat if name not in PART_OF), None)
        if unknown is not None:
            raise TypeError(f"HarnessConfig has no field {unknown!r}")
        values = old_spellings(flat)
        for name, parse in PARSERS.items():
            if name in values:
                values[name] = parse(values[name], name)
        return cls(**{part: part_cls(**{k: v for k, v in values.items() if PART_OF[k] == part})
                      for part, part_cls in PARTS.items()})

    def flat(self) -> dict[str, Any]:
        """Every field under its flat name, parsed (enums, tuples)."""
        return {name: getattr(getattr(self, part), name) for name, part in PART_OF.items()}

    # -- derived values ------------------------------------------------------------------

    @property
    def use_ubatching(self) -> bool:
        return self.serving.enable_dbo or self.serving.ubatch_size > 1

    @property
    def num_ubatches(self) -> int:
        """k: the number of microbatches a microbatched step is split into (1 = off)."""
        return self.microbatches_of(self.serving.enable_dbo, self.serving.ubatch_size)

    @staticmethod
    def microbatches_of(enable_dbo: bool, ubatch_size: int) -> int:
        if enable_dbo:
            return 2
        return ubatch_size if ubatch_size > 1 else 1

    @cached_property
    def cudagraph_capture_sizes(self) -> tuple[int, ...]:
        s = self.serving
        if s.cudagraph_mode is CudaGraphMode.NONE:
            return ()
        if s.capture_sizes is not None:
            return tuple(sorted(set(s.capture_sizes)))
        return default_capture_sizes(s.max_num_reqs, s.max_num_batched_tokens,
                                     s.decode_query_len, s.release.request_keyed_decode)

    @property
    def decode_query_lens(self) -> tuple[tuple[int, int], ...]:
        """(q, most requests) per uniform decode query length, by batch size: the draft
        schedule's, or the one q for any batch (vLLM's get_decode_cudagraph_query_lens)."""
        s = self.serving
        if s.draft_schedule is None:
            return ((s.decode_query_len, s.max_num_reqs),)
        return tuple(sorted(s.draft_schedule, key=lambda pair: pair[1]))

    def query_len_for(self, num_reqs: int) -> int:
        """The query length the draft schedule gives a decode batch of `num_reqs` requests."""
        return next((q for q, most in self.decode_query_lens if num_reqs <= most),
                    self.serving.decode_query_len)

    def longest_uniform_batch(self, length: int) -> int:
        """The most requests a uniform decode of `length` tokens each can have: a request
        carries at most the drafts the schedule gives its batch size, maybe fewer (§1.6)."""
        return max((b for b in range(1, self.serving.max_num_reqs + 1)
                    if length <= self.query_len_for(b)), default=0)

    @property
    def max_capture_size(self) -> int:
        sizes = self.cudagraph_capture_sizes
        return sizes[-1] if sizes else 0

    @property
    def num_experts(self) -> int:
        return self.model.experts_per_rank * self.serving.dp_size

    def decode_threshold_for_rank(self, rank: int) -> int:
        if rank == self.mutation.threshold_offset_rank:
            return self.serving.decode_threshold + self.mutation.threshold_offset
        return self.serving.decode_threshold

    @property
    def uses_vllm(self) -> bool:
        """Whether any of vLLM's code runs in the ranks (its decisions or its execution)."""
        return self.system.sut is DecisionSystem.VLLM or self.system.execution is Execution.VLLM

    # -- validation: the rules across parts, in one order ---------------------------------

    def _validate(self) -> None:
        s, m, values = self.serving, self.mutation, self.flat()
        positive = ("dp_size", "max_num_reqs", "max_num_batched_tokens", "hidden_size",
                    "experts_per_rank", "top_k")
        for name in positive:
            value = values[name]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(name, f"must be a positive integer, got {value!r}")
        for name in ("ubatch_size", "decode_threshold", "prefill_threshold"):
            value = values[name]
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(name, f"must be a non-negative integer, got {value!r}")
        self._validate_types()
        check_spec_decoding(s.decode_query_len, s.varlen_decode, self.use_ubatching, s.release)
        check_draft_schedule(s.draft_schedule, s.decode_query_len, s.max_num_reqs, s.release)
        check_fault_tolerance(s.fault_tolerance, s.release, s.dp_size)
        self._validate_capture_sizes()
        if self.use_ubatching:
            self._validate_microbatching()
        if self.model.top_k > self.num_experts:
            raise ConfigError("top_k", f"top_k={self.model.top_k} exceeds "
                              f"num_experts={self.num_experts}")
        if (s.all2all_backend is All2AllBackend.HIGH_THROUGHPUT and s.dp_size > 1
                and s.cudagraph_mode is not CudaGraphMode.NONE):
            raise ConfigError("all2all_backend", "deepep_high_throughput with dp_size > 1 "
                              "forces cudagraph_mode NONE (its all-to-all cannot be captured)")
        for name in VLLM_EXECUTION_SWITCHES:
            if (getattr(m, name) != getattr(_REFERENCE, name)
                    and self.system.execution is not Execution.VLLM):
                raise ConfigError(name, "switches vLLM's execution code: it needs "
                                  "execution vllm")
        if s.single_rank_gpu_world and s.dp_size != 1:
            raise ConfigError("single_rank_gpu_world", f"means one rank, not {s.dp_size}")
        self._validate_system()
        if m.threshold_offset_rank is not None and not (
                0 <= m.threshold_offset_rank < s.dp_size):
            raise ConfigError("threshold_offset_rank", f"rank {m.threshold_offset_rank} "
                              f"is outside dp_size={s.dp_size}")

    def _validate_system(self) -> None:
        """vLLM's code under test refuses the switches of the harness's own code."""
        system, m = self.system, self.mutation
        if system.sut is DecisionSystem.VLLM:
            for name in HARNESS_DECISION_SWITCHES:
                if getattr(m, name) != getattr(_REFERENCE, name):
                    raise ConfigError(name, "switches the harness's own decision code; the "
                                      "vllm system under test brings its own")
        if self.serving.staging and self.uses_vllm:
            raise ConfigError("staging", "needs the harness's own decisions and execution: "
                              "vLLM's code does not stage real tokens (docs/spec.md §3.4)")
        for name in HARNESS_EXECUTION_SWITCHES if system.execution is Execution.VLLM else ():
            if getattr(m, name) != getattr(_REFERENCE, name):
                raise ConfigError(name, "switches the harness's own execution; with execution "
                                  "vllm, vLLM's runner and graph manager bring their own")
        check_vllm_code_fields(system.vllm_src, system.vllm_patches,
                               system.differential_against_base)

    def _validate_types(self) -> None:
        """Types and ranges a file could get wrong with nothing later noticing (or only a
        crash in a rank)."""
        s, m, seed = self.serving, self.mutation, self.model.seed
        for name, value in (("enable_dbo", s.enable_dbo), ("staging", s.staging),
                            ("single_rank_gpu_world", s.single_rank_gpu_world)):
            if not isinstance(value, bool):
                raise ConfigError(name, f"must be true or false, got {value!r}")
        for name, value in (("max_num_reqs", s.max_num_reqs),
                            ("max_num_batched_tokens", s.max_num_batched_tokens)):
            if value > INT32_MAX:
                raise ConfigError(name, f"is {value}, above {INT32_MAX}: the DP "
                                  "sync all-reduces counts as int32")
        # torch takes seeds from -2**63 to 2**64 - 1, and the model seeds rank r with
        # seed * 1009 + r + 1.
        if not _is_int(seed) or not (
                -(2**63) <= seed * 1009 and seed * 1009 + s.dp_size < 2**64):
            raise ConfigError("seed", f"must be an integer whose seed * 1009 + rank + 1 fits "
                              f"torch's 64-bit seed, got {seed!r}")
        if not _is_int(m.threshold_offset):
            raise ConfigError("threshold_offset",
                              f"must be an integer, got {m.threshold_offset!r}")
        if m.threshold_offset_rank is not None and not _is_int(m.threshold_offset_rank):
            raise ConfigError("threshold_offset_rank",
                              f"must be an integer rank, got {m.threshold_offset_rank!r}")

    def _validate_capture_sizes(self) -> None:
        s = self.serving
        if s.capture_sizes is None:
            return
        if s.cudagraph_mode is CudaGraphMode.NONE:
            return
        if not s.capture_sizes:
            raise ConfigError("capture_sizes", "is empty while cudagraph_mode is "
                              f"{s.cudagraph_mode.name}")
        for size in s.capture_sizes:
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise ConfigError("capture_sizes", f"holds {size!r}; sizes must be positive")
            if size > s.max_num_batched_tokens:
                raise ConfigError("capture_sizes", f"holds {size}, above max_num_batched_tokens="
                                  f"{s.max_num_batched_tokens}")

    def _validate_microbatching(self) -> None:
        s, k = self.serving, self.num_ubatches
        if k < 2:
            raise ConfigError("num_ubatches", f"is {k}; microbatching needs at least 2")
        if s.dp_size < 2 and not s.single_rank_gpu_world:
            raise ConfigError("dp_size",
                              f"is {s.dp_size}; microbatching (DBO) needs dp_size >= 2")
        if s.cudagraph_mode is CudaGraphMode.PIECEWISE:
            raise ConfigError("cudagraph_mode", "PIECEWISE is unsupported with microbatching "
                              "(DBO captures FULL graphs only)")
        for name, value in (("decode_threshold", s.decode_threshold),
                            ("prefill_threshold", s.prefill_threshold)):
            if value < k:
                raise ConfigError(name, f"is {value}, below the number of microbatches {k}")
        rank = self.mutation.threshold_offset_rank
        if rank is not None and self.decode_threshold_for_rank(rank) < 0:
            raise ConfigError("threshold_offset", "moves the decode threshold below 0")

    # -- the flat wire form ----------------------------------------------------------------

    def with_changes(self, **changes: Any) -> HarnessConfig:
        """This config with some flat fields changed, each in its part."""
        return HarnessConfig.of(**{**self.flat(), **changes})

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for part in PARTS:
            for f in fields(getattr(self, part)):
                value = getattr(getattr(self, part), f.name)
                if f.name in _OMITTED_WHEN_DEFAULT and value == f.default:
                    continue  # configs that test no vLLM code read as they did before
                out[f.name] = wire_value(value)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HarnessConfig:
        return cls.of(**config_kwargs(data))


_OMITTED_WHEN_DEFAULT = ("vllm_src", "vllm_patches", "differential_against_base",
                         "decode_query_len", "varlen_decode", "query_len_bound", "execution",
                         "switch_to_compute", "continuation", "lookback_refresh", "idle_step",
                         "dummy_execution", "draft_sync_state", "replay_tag", "ids_gather_wait",
                         "staging_restore", "staging_vote", "draft_schedule", "verify_slices",
                         "fault_tolerance", "dead_set", "staging")


def old_spellings(flat: dict[str, Any]) -> dict[str, Any]:
    """Flat fields with an old spelling put the way it is said now: `guard: staged`, from when
    staging was stored among the bug switches, is `staging: true` under the fixed guard."""
    if flat.get("guard") != "staged":
        return dict(flat)
    if flat.get("staging") is False:
        raise ConfigError("guard", "staged (the old spelling of staging: true) contradicts "
                          "staging: false; give one of them")
    return {**flat, "guard": Guard.FIXED.value, "staging": True}


def config_kwargs(data: dict[str, Any]) -> dict[str, Any]:
    """Check the keys of a config mapping and translate the `num_ubatches` shorthand."""
    if not isinstance(data, dict):
        raise ConfigError("config", "must be a table/object of fields")
    kwargs = dict(data)
    if "num_ubatches" in kwargs:
        kwargs.update(ubatching_fields(kwargs.pop("num_ubatches")))
    for key in kwargs:
        if key not in PART_OF:
            raise ConfigError(key, "is not a config field")
    return kwargs


def ubatching_fields(num_ubatches: Any) -> dict[str, Any]:
    """Map a microbatch count onto vLLM's flags: 2 is DBO, k > 2 is --ubatch-size k."""
    if not isinstance(num_ubatches, int) or isinstance(num_ubatches, bool) or num_ubatches < 2:
        raise ConfigError("num_ubatches", f"is {num_ubatches!r}; microbatching needs at least 2 "
                          "(turn it off with enable_dbo=false)")
    if num_ubatches == 2:
        return {"enable_dbo": True, "ubatch_size": 0}
    return {"enable_dbo": False, "ubatch_size": num_ubatches}


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a JSON or TOML file of config fields (by extension; JSON otherwise)."""
    data = read_data_file(path, "config")
    if isinstance(data, dict) and isinstance(data.get("config"), dict):
        # A scenario file: its config is used; a config field beside it would be ignored.
        beside = set(data) - {"name", "description", "config", "steps", "faults", "expect"}
        if beside:
            raise ConfigError(sorted(beside)[0], f"sits beside `config` in {path}; put it in it")
        data = data["config"]
    if not isinstance(data, dict):
        raise ConfigError("config", f"{path} must hold a table/object of fields")
    return data
