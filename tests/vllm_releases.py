"""What the vLLM tests need to know of the releases: which of them still ship the bugs a test
pins, and the project's patches written against each (scenarios/vllm/patches/, one folder a
release after 0.33.0)."""

from __future__ import annotations

from pathlib import Path

from harness.vllm_code.source import VllmPatch, read_patch
from harness.vllm_sut.available import vllm_version

PATCHES = Path(__file__).resolve().parents[1] / "scenarios" / "vllm" / "patches"
# dp_utils' guard `2 * min < G` and ubatching.py (#55586's hang and crash) are the same in both.
SHIPS_THE_KNOWN_BUGS = ("0.33.0", "0.34.0")


def ships_the_known_bugs() -> bool:
    return vllm_version() in SHIPS_THE_KNOWN_BUGS


def release_patch(name: str) -> VllmPatch:
    """The patch `name` as written against the installed release (0.33.0's at the top)."""
    minor = ".".join((vllm_version() or "").split(".")[:2])
    rebased = PATCHES / minor / name
    return read_patch(rebased if rebased.is_file() else PATCHES / name)
