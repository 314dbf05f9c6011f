"""vLLM's own decision functions (vllm==0.33.0) as a second system under test.

Importing this package does not import vLLM; `available.vllm_version()` says whether it can.
The other modules import vLLM at the top and are only imported once it is known to import.

Where vLLM's compiled extensions are absent (the GPU machine's bundle,
tools/vllm_gpu_bundle.py, leaves them out), vLLM runs with its CPU platform: its CUDA
platform cannot import without them. The choice is made before any harness module imports
vLLM: each of them is in this package or in harness.vllm_exec, which imports this one first.
What the CUDA platform would supply to the execution code is then stood in
(harness/vllm_exec/stand_ins.py); a full install keeps its own platform.
"""

import importlib.util
from pathlib import Path


def _without_compiled_extensions() -> bool:
    """vLLM is installed but its `_C_stable_libtorch` extension is not (found without
    importing vLLM, whose platform is chosen at its first use)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return False
    return not any(Path(spec.origin).parent.glob("_C_stable_libtorch*"))


if _without_compiled_extensions():
    import os

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from harness.vllm_sut import system  # noqa: E402, F401 - puts vLLM's code in the rank's slots
