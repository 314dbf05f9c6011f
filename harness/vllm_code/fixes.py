"""The project's fixes of known vLLM bugs (scenarios/vllm/patches/): each written against
0.33.0 in the folder itself, and again under a folder named by a release ("0.34/") where that
release moved the code it touches. One place resolves a fix's name for a release."""

from __future__ import annotations

from pathlib import Path

PATCHES = Path(__file__).resolve().parents[2] / "scenarios" / "vllm" / "patches"


def fix_path(name: str, release: str) -> Path | None:
    """The fix `name` as written against `release` ("0.34" or "0.34.0"), else against 0.33.0;
    None where the project has neither."""
    folder = ".".join(release.split(".")[:2])
    return next((p for p in (PATCHES / folder / name, PATCHES / name) if p.is_file()), None)


def fix_names() -> list[str]:
    """Every fix the project keeps, for any release."""
    return sorted({p.name for p in PATCHES.rglob("*.diff")})


def releases_fixed(name: str) -> list[str]:
    """The releases the fix `name` is written for: "0.33" for the folder's own file, and each
    release folder holding one."""
    return sorted({"0.33" if p.parent == PATCHES else p.parent.name
                   for p in PATCHES.rglob(name) if p.is_file()})
