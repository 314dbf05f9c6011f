"""Whether vLLM's decision layer imports here, and why not when it does not."""

from __future__ import annotations

import importlib
from functools import lru_cache

# The modules the adapter calls into; importing them is the whole requirement (no GPU).
VLLM_MODULES = (
    "vllm.config",
    "vllm.distributed.utils",
    "vllm.v1.worker.ubatch_utils",
    "vllm.v1.worker.gpu.cudagraph_utils",
    "vllm.v1.worker.gpu.dp_utils",
)


@lru_cache(maxsize=1)
def _probe() -> tuple[str | None, str]:
    try:
        for name in VLLM_MODULES:
            importlib.import_module(name)
        import vllm
    except Exception as exc:  # any import failure means "absent", with why
        first_line = (str(exc).splitlines() or [""])[0]
        return None, f"vllm does not import: {type(exc).__name__}: {first_line}"
    return str(vllm.__version__), ""


def vllm_version() -> str | None:
    """vLLM's version string, or None when its decision modules do not import."""
    return _probe()[0]


def unavailable_reason() -> str:
    """One line saying why vLLM is absent ('' when it imports)."""
    return _probe()[1]


def installed_release():
    """The release whose API the vLLM that imports has (harness.config.Release); imports it."""
    from harness.vllm_sut.code import CodeKey, code_for

    return code_for(CodeKey()).api

