"""Which of the vLLM APIs the harness knows a tree exposes (docs/vllm.md §9).

A release is recognised by the code it carries, not by its version string, so that a
checkout of main whose API is a known one keeps working. Each API is a list of marks: a
callable taking a named parameter, or a dataclass with a named field. A tree that shows
every mark of none of them is refused with one line naming its version and, for the API
it comes closest to, what it lacks. Importing this module does not import vLLM.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType

from harness.errors import HarnessCannot
from harness.vllm_code.release import Release


@dataclass(frozen=True)
class Mark:
    """`module`.`owner` takes parameter (or has field) `name`."""

    module: str  # a key of VllmCode.modules
    owner: str  # "Class.method", "Class" (a dataclass) or "function"
    name: str

    def where(self) -> str:
        return f"{self.module.replace('.', '/')}.py {self.owner}({self.name})"


_CGU = "vllm.v1.worker.gpu.cudagraph_utils"
_DPU = "vllm.v1.worker.gpu.dp_utils"
_RUN = "vllm.v1.worker.gpu.ubatch_utils"

# The marks of each API: what the adapters call with that API's arguments. The execution
# module's marks count only where the tree has it (an older tree decides all the same).
MARKS: dict[Release, tuple[Mark, ...]] = {
    Release.V0_33: (
        Mark(_CGU, "CudaGraphManager.__init__", "decode_query_len"),
        Mark(_DPU, "dispatch_cg_and_sync_dp", "allow_skip_drafts"),
        Mark(_DPU, "DPSyncState", "skip_drafts"),
        Mark(_RUN, "UBatchRunner.prepare", "cg_mode"),
    ),
    Release.V0_34: (
        Mark(_CGU, "CudaGraphManager.__init__", "decode_query_lens"),
        Mark(_CGU, "CudaGraphManager.__init__", "decode_request_sizes"),
        Mark(_DPU, "dispatch_cg_and_sync_dp", "allow_skip_drafts"),
        Mark(_DPU, "DPSyncState", "max_query_len"),
        Mark(_RUN, "UBatchRunner.prepare", "batch_desc"),
        Mark(_RUN, "UBatchRunner.prepare", "dp_sync_state"),
        Mark(_RUN, "create_ubatch_slices", "uniform_token_count"),
    ),
}


def _names_of(owner: object) -> set[str]:
    if dataclasses.is_dataclass(owner):
        return {f.name for f in dataclasses.fields(owner)}
    try:
        return set(inspect.signature(owner).parameters)
    except (TypeError, ValueError):
        return set()


def _holds(mark: Mark, modules: Mapping[str, ModuleType]) -> bool | None:
    """Whether the mark holds; None where its module is not part of the tree."""
    module = modules.get(mark.module)
    if module is None:
        return None
    owner: object = module
    for part in mark.owner.split("."):
        owner = getattr(owner, part, None)
        if owner is None:
            return False
    return mark.name in _names_of(owner)


def missing_marks(api: Release, modules: Mapping[str, ModuleType]) -> list[Mark]:
    return [m for m in MARKS[api] if _holds(m, modules) is False]


def detect_api(modules: Mapping[str, ModuleType], version: str) -> Release:
    """The release whose API the modules expose (the newest that fits); HarnessCannot naming
    what is missing otherwise."""
    misses = {api: missing_marks(api, modules) for api in Release}
    for api in reversed(Release):
        if not misses[api]:
            return api
    closest = min(Release, key=lambda api: (len(misses[api]), -list(Release).index(api)))
    lacking = ", ".join(m.where() for m in misses[closest])
    known = ", ".join(api.value for api in Release)
    raise HarnessCannot("vllm", f"vllm {version} has an API the harness does not know "
                        f"(it knows {known}); closest is {closest.value}, which needs "
                        f"{lacking}")
