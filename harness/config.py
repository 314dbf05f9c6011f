"""The harness configuration: one frozen object every rank builds identically.

Field names follow vLLM's ParallelConfig / SchedulerConfig / CompilationConfig where a field
has a counterpart there (docs/spec.md §0); the variant switches select known bugs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from harness.bug_switches import (
    A2ABuffers,
    CaptureKey,
    CaptureOn,
    DummyPadding,
    EagerSlices,
    Guard,
    QueryLenBound,
    SwitchToCompute,
    Twins,
    UbatchVote,
)
from harness.config_values import check_spec_decoding, default_capture_sizes, parse_enum
from harness.data_file import read_data_file
from harness.errors import ConfigError
from harness.vllm_code.source import VllmPatch, check_vllm_code_fields, parse_patches


class CudaGraphMode(enum.Enum):
    """vLLM's CUDAGraphMode: three runtime modes and two composite ones (decode, mixed)."""

    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (2, 0)
    FULL_AND_PIECEWISE = (2, 1)

    def separate_routine(self) -> bool:
        return isinstance(self.value, tuple)

    def decode_mode(self) -> CudaGraphMode:
        return CudaGraphMode(self.value[0]) if self.separate_routine() else self

    def mixed_mode(self) -> CudaGraphMode:
        return CudaGraphMode(self.value[1]) if self.separate_routine() else self

    @classmethod
    def parse(cls, name: str | CudaGraphMode, field_name: str = "cudagraph_mode") -> CudaGraphMode:
        if isinstance(name, CudaGraphMode):
            return name
        try:
            return cls[str(name).upper()]
        except KeyError:
            names = ", ".join(m.name for m in cls)
            raise ConfigError(field_name, f"unknown mode {name!r} (one of {names})") from None


class UbatchProtocol(enum.Enum):
    """Which microbatch thread protocol runs eager microbatched steps (docs/spec.md §5.5-5.6)."""

    ABORTABLE = "abortable"  # a failing microbatch unwinds its siblings: the reference
    STOCK = "stock"  # vLLM as merged: spec §7.4 (sibling hang), §7.3 (recv_hook on None)


class All2AllBackend(enum.Enum):
    """How the MoE layer overlaps its all-to-alls (docs/spec.md §5.4)."""

    LOW_LATENCY = "deepep_low_latency"  # async send, receive as a hook run by the next ubatch
    HIGH_THROUGHPUT = "deepep_high_throughput"  # yield first, then a blocking all-to-all


class DecisionSystem(enum.Enum):
    """Whose decision code the ranks run: candidates, dispatch, thresholds and the DP sync."""

    HARNESS = "harness"  # the harness's miniature, with its variant switches
    VLLM = "vllm"  # the installed vLLM's own functions (harness/vllm_sut)


class Execution(enum.Enum):
    """Whose code runs a decided step: microbatch threads, handoffs, capture, replay."""
    HARNESS = "harness"  # the harness's runner, ring protocol and graph manager
    VLLM = "vllm"  # vLLM's UBatchRunner, UBatchContexts and ModelCudaGraphManager (vllm_exec)


# The DP sync all-reduces token and request counts as int32, as vLLM does.
INT32_MAX = 2**31 - 1
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Switches of the harness's miniature; the vllm system brings its own behaviour.
HARNESS_ONLY_FIELDS = (("guard", "fixed"), ("twins", "reachable"), ("threshold_offset_rank", None),
                       ("ubatch_vote", "synced"), ("query_len_bound", "synced"))
# Switches of the harness's own execution; vLLM's runner and graph manager bring their own.
HARNESS_EXECUTION_FIELDS = (("protocol", "abortable"), ("capture_on", "runner"), ("capture_key",
                            "total"), ("eager_slices", "own"), ("dummy_padding", "agreed"))


@dataclass(frozen=True)
class HarnessConfig:
    dp_size: int = 2
    # vLLM semantics: enable_dbo forces 2 microbatches, else ubatch_size > 1 gives that many.
    enable_dbo: bool = True
    ubatch_size: int = 0
    decode_threshold: int = 32
    prefill_threshold: int = 512
    cudagraph_mode: CudaGraphMode = CudaGraphMode.FULL
    # None: generated from max_num_reqs and max_num_batched_tokens (docs/spec.md §0.3).
    capture_sizes: tuple[int, ...] | None = None
    max_num_reqs: int = 64
    max_num_batched_tokens: int = 256
    # Tokens of a decode request: 1 + draft tokens. Drafts exist only without microbatching
    # (vLLM rejects speculative decoding with DBO); varlen_decode: adaptive verification.
    decode_query_len: int = 1
    varlen_decode: bool = False
    hidden_size: int = 16
    experts_per_rank: int = 2  # experts are sharded evenly: dp_size * experts_per_rank in all
    top_k: int = 2
    seed: int = 0
    guard: Guard = Guard.FIXED
    twins: Twins = Twins.REACHABLE
    # Fault switch: this rank generates twins with the decode threshold moved by the offset.
    threshold_offset_rank: int | None = None
    threshold_offset: int = 0
    protocol: UbatchProtocol = UbatchProtocol.ABORTABLE
    all2all_backend: All2AllBackend = All2AllBackend.LOW_LATENCY
    capture_on: CaptureOn = CaptureOn.RUNNER
    sut: DecisionSystem = DecisionSystem.HARNESS
    # Whose code executes the decided step (`--exec`): the harness's or vLLM's own.
    execution: Execution = Execution.HARNESS
    # sut vllm only: a checkout's decision modules, diffs applied over them in memory, and
    # the unpatched vLLM's decisions held up beside the reference (harness/vllm_sut/code.py).
    vllm_src: str | None = None
    vllm_patches: tuple[VllmPatch, ...] = ()
    differential_against_base: bool = False
    # Bugs of vLLM's history (docs/spec.md §7.12-7.15), planted by the variants.
    capture_key: CaptureKey = CaptureKey.TOTAL
    eager_slices: EagerSlices = EagerSlices.OWN
    a2a_buffers: A2ABuffers = A2ABuffers.MAX_TOKENS
    ubatch_vote: UbatchVote = UbatchVote.SYNCED
    dummy_padding: DummyPadding = DummyPadding.AGREED
    query_len_bound: QueryLenBound = QueryLenBound.SYNCED
    # vLLM's execution, high throughput: whether compute waits for the all-to-all (§11).
    switch_to_compute: SwitchToCompute = SwitchToCompute.SYNC
    # The GPU suite's world of one rank (one GPU): microbatching with dp_size 1, whose
    # all-to-all is a size-one NCCL op. Allowed nowhere else.
    single_rank_gpu_world: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "cudagraph_mode", CudaGraphMode.parse(self.cudagraph_mode))
        object.__setattr__(self, "sut", parse_enum(DecisionSystem, self.sut, "sut"))
        object.__setattr__(self, "execution", parse_enum(Execution, self.execution, "execution"))
        object.__setattr__(self, "vllm_patches", parse_patches(self.vllm_patches))
        for name, enum_cls in (("guard", Guard), ("twins", Twins), ("protocol", UbatchProtocol),
                               ("all2all_backend", All2AllBackend), ("capture_on", CaptureOn),
                               ("capture_key", CaptureKey), ("eager_slices", EagerSlices),
                               ("a2a_buffers", A2ABuffers), ("ubatch_vote", UbatchVote),
                               ("dummy_padding", DummyPadding),
                               ("query_len_bound", QueryLenBound),
                               ("switch_to_compute", SwitchToCompute)):
            object.__setattr__(self, name, parse_enum(enum_cls, getattr(self, name), name))
        if self.capture_sizes is not None:
            if not isinstance(self.capture_sizes, list | tuple):
                raise ConfigError("capture_sizes", "must be a list of positive integers, got "
                                  f"{self.capture_sizes!r}")
            object.__setattr__(self, "capture_sizes", tuple(self.capture_sizes))
        self._validate()

    # -- derived values ------------------------------------------------------------------

    @property
    def use_ubatching(self) -> bool:
        return self.enable_dbo or self.ubatch_size > 1

    @property
    def num_ubatches(self) -> int:
        """k: the number of microbatches a microbatched step is split into (1 = off)."""
        return self.microbatches_of(self.enable_dbo, self.ubatch_size)

    @staticmethod
    def microbatches_of(enable_dbo: bool, ubatch_size: int) -> int:
        if enable_dbo:
            return 2
        return ubatch_size if ubatch_size > 1 else 1

    @cached_property
    def cudagraph_capture_sizes(self) -> tuple[int, ...]:
        if self.cudagraph_mode is CudaGraphMode.NONE:
            return ()
        if self.capture_sizes is not None:
            return tuple(sorted(set(self.capture_sizes)))
        return default_capture_sizes(self.max_num_reqs, self.max_num_batched_tokens,
                                     self.decode_query_len)

    @property
    def max_capture_size(self) -> int:
        sizes = self.cudagraph_capture_sizes
        return sizes[-1] if sizes else 0

    @property
    def num_experts(self) -> int:
        return self.experts_per_rank * self.dp_size

    def decode_threshold_for_rank(self, rank: int) -> int:
        if rank == self.threshold_offset_rank:
            return self.decode_threshold + self.threshold_offset
        return self.decode_threshold

    # -- validation ----------------------------------------------------------------------

    def _validate(self) -> None:
        positive = ("dp_size", "max_num_reqs", "max_num_batched_tokens", "hidden_size",
                    "experts_per_rank", "top_k")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(name, f"must be a positive integer, got {value!r}")
        for name in ("ubatch_size", "decode_threshold", "prefill_threshold"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(name, f"must be a non-negative integer, got {value!r}")
        self._validate_types()
        check_spec_decoding(self.decode_query_len, self.varlen_decode, self.use_ubatching)
        self._validate_capture_sizes()
        if self.use_ubatching:
            self._validate_microbatching()
        if self.top_k > self.num_experts:
            raise ConfigError("top_k", f"top_k={self.top_k} exceeds num_experts={self.num_experts}")
        if (self.all2all_backend is All2AllBackend.HIGH_THROUGHPUT and self.dp_size > 1
                and self.cudagraph_mode is not CudaGraphMode.NONE):
            raise ConfigError("all2all_backend", "deepep_high_throughput with dp_size > 1 "
                              "forces cudagraph_mode NONE (its all-to-all cannot be captured)")
        if (self.switch_to_compute is not SwitchToCompute.SYNC
                and self.execution is not Execution.VLLM):
            raise ConfigError("switch_to_compute", "switches vLLM's execution code: it needs "
                              "execution vllm")
        if self.single_rank_gpu_world and self.dp_size != 1:
            raise ConfigError("single_rank_gpu_world", f"means one rank, not {self.dp_size}")
        if self.sut is DecisionSystem.VLLM:
            for name, default in HARNESS_ONLY_FIELDS:
                value = getattr(self, name)
                if getattr(value, "value", value) != default:
                    raise ConfigError(name, "switches the harness's own decision code; the "
                                      "vllm system under test brings its own")
        for name, default in HARNESS_EXECUTION_FIELDS if self.execution is Execution.VLLM else ():
            if getattr(self, name).value != default:
                raise ConfigError(name, "switches the harness's own execution; with execution "
                                  "vllm, vLLM's runner and graph manager bring their own")
        check_vllm_code_fields(self.vllm_src, self.vllm_patches, self.differential_against_base)
        if self.threshold_offset_rank is not None and not (
                0 <= self.threshold_offset_rank < self.dp_size):
            raise ConfigError("threshold_offset_rank", f"rank {self.threshold_offset_rank} "
                              f"is outside dp_size={self.dp_size}")


    @property
    def uses_vllm(self) -> bool:
        """Whether any of vLLM's code runs in the ranks (its decisions or its execution)."""
        return self.sut is DecisionSystem.VLLM or self.execution is Execution.VLLM

    def _validate_types(self) -> None:
        """Types and ranges a file could get wrong with nothing later noticing (or only a
        crash in a rank)."""
        for name in ("enable_dbo", "single_rank_gpu_world"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, f"must be true or false, got {getattr(self, name)!r}")
        for name in ("max_num_reqs", "max_num_batched_tokens"):
            if getattr(self, name) > INT32_MAX:
                raise ConfigError(name, f"is {getattr(self, name)}, above {INT32_MAX}: the DP "
                                  "sync all-reduces counts as int32")
        # torch takes seeds from -2**63 to 2**64 - 1, and the model seeds rank r with
        # seed * 1009 + r + 1.
        if not _is_int(self.seed) or not (
                -(2**63) <= self.seed * 1009 and self.seed * 1009 + self.dp_size < 2**64):
            raise ConfigError("seed", f"must be an integer whose seed * 1009 + rank + 1 fits "
                              f"torch's 64-bit seed, got {self.seed!r}")
        if not _is_int(self.threshold_offset):
            raise ConfigError("threshold_offset",
                              f"must be an integer, got {self.threshold_offset!r}")
        if self.threshold_offset_rank is not None and not _is_int(self.threshold_offset_rank):
            raise ConfigError("threshold_offset_rank",
                              f"must be an integer rank, got {self.threshold_offset_rank!r}")

    def _validate_capture_sizes(self) -> None:
        if self.capture_sizes is None:
            return
        if self.cudagraph_mode is CudaGraphMode.NONE:
            return
        if not self.capture_sizes:
            raise ConfigError("capture_sizes", "is empty while cudagraph_mode is "
                              f"{self.cudagraph_mode.name}")
        for size in self.capture_sizes:
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise ConfigError("capture_sizes", f"holds {size!r}; sizes must be positive")
            if size > self.max_num_batched_tokens:
                raise ConfigError("capture_sizes", f"holds {size}, above max_num_batched_tokens="
                                  f"{self.max_num_batched_tokens}")

    def _validate_microbatching(self) -> None:
        k = self.num_ubatches
        if k < 2:
            raise ConfigError("num_ubatches", f"is {k}; microbatching needs at least 2")
        if self.dp_size < 2 and not self.single_rank_gpu_world:
            raise ConfigError("dp_size",
                              f"is {self.dp_size}; microbatching (DBO) needs dp_size >= 2")
        if self.cudagraph_mode is CudaGraphMode.PIECEWISE:
            raise ConfigError("cudagraph_mode", "PIECEWISE is unsupported with microbatching "
                              "(DBO captures FULL graphs only)")
        for name in ("decode_threshold", "prefill_threshold"):
            if getattr(self, name) < k:
                raise ConfigError(name, f"is {getattr(self, name)}, below the number of "
                                  f"microbatches {k}")
        if self.threshold_offset_rank is not None and self.decode_threshold_for_rank(
                self.threshold_offset_rank) < 0:
            raise ConfigError("threshold_offset", "moves the decode threshold below 0")

    # -- construction from data ----------------------------------------------------------

    def with_changes(self, **changes: Any) -> HarnessConfig:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            if not f.init:
                continue
            value = getattr(self, f.name)
            if f.name in _OMITTED_WHEN_DEFAULT and value == f.default:
                continue  # configs that test no vLLM code read as they did before
            if f.name == "vllm_patches":
                value = [p.to_dict() for p in value]
            elif isinstance(value, enum.Enum):
                value = value.name if isinstance(value, CudaGraphMode) else value.value
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HarnessConfig:
        return cls(**config_kwargs(data))


_OMITTED_WHEN_DEFAULT = ("vllm_src", "vllm_patches", "differential_against_base",
                         "decode_query_len", "varlen_decode", "query_len_bound", "execution",
                         "switch_to_compute")


def config_kwargs(data: dict[str, Any]) -> dict[str, Any]:
    """Check the keys of a config mapping and translate the `num_ubatches` shorthand."""
    if not isinstance(data, dict):
        raise ConfigError("config", "must be a table/object of fields")
    known = {f.name for f in fields(HarnessConfig) if f.init}
    kwargs = dict(data)
    if "num_ubatches" in kwargs:
        kwargs.update(ubatching_fields(kwargs.pop("num_ubatches")))
    for key in kwargs:
        if key not in known:
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
