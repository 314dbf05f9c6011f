"""The vLLM code a config names: a tree (the installed vllm, or a checkout) and the patches
applied over it, each patch carried whole with its content hash so that every rank process
rebuilds the same private copies and can tell when it was handed other code."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.vllm_code.patch import PatchError, apply_file_patch, parse_diff

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
FIELD = "vllm_patches"


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class VllmPatch:
    """A unified diff against vLLM's source tree. Saved scenarios keep only the name and the
    hash; a patch without its diff must be given again (`--vllm-patch FILE`) to run."""

    name: str
    sha256: str
    diff: str | None = field(default=None, compare=False, repr=False)
    path: str | None = field(default=None, compare=False)  # where it was read from, if known

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"{FIELD}.name", f"must be a non-empty string, got {self.name!r}")
        if not isinstance(self.sha256, str) or not _SHA256.match(self.sha256):
            raise ConfigError(f"{FIELD}.sha256", f"{self.name}: must be 64 lowercase hex "
                              f"digits, got {self.sha256!r}")
        if self.diff is not None:
            if not isinstance(self.diff, str):
                raise ConfigError(f"{FIELD}.diff", f"{self.name}: must be the diff's text")
            got = content_hash(self.diff)
            if got != self.sha256:
                raise ConfigError(f"{FIELD}.diff", f"{self.name}: its content hashes to "
                                  f"{got[:12]}, not the recorded {self.sha256[:12]}")

    @property
    def short(self) -> str:
        return f"{self.name} ({self.sha256[:12]})"

    @property
    def resolved(self) -> bool:
        return self.diff is not None

    def to_dict(self, with_diff: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "sha256": self.sha256}
        if self.path is not None:
            data["path"] = self.path
        if with_diff and self.diff is not None:
            data["diff"] = self.diff
        return data

    @classmethod
    def from_value(cls, value: Any) -> VllmPatch:
        if isinstance(value, VllmPatch):
            return value
        if not isinstance(value, dict):
            raise ConfigError(FIELD, f"each entry must be an object with name and sha256, got "
                              f"{value!r}")
        unknown = set(value) - {"name", "sha256", "diff", "path"}
        if unknown:
            raise ConfigError(f"{FIELD}.{sorted(unknown)[0]}", "is not a patch field (name, "
                              "sha256, diff, path)")
        return cls(value.get("name"), value.get("sha256"), value.get("diff"),
                   value.get("path"))


def parse_patches(value: Any) -> tuple[VllmPatch, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise ConfigError(FIELD, f"must be a list of patches, got {value!r}")
    patches = tuple(VllmPatch.from_value(v) for v in value)
    names = [p.name for p in patches]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise ConfigError(FIELD, f"names {twice} twice")
    return patches


def check_vllm_code_fields(vllm_src: Any, patches: tuple[VllmPatch, ...],
                           differential_against_base: Any) -> None:
    """The config fields naming vLLM code, checked where the config is built."""
    if vllm_src is not None and (not isinstance(vllm_src, str) or not vllm_src):
        raise ConfigError("vllm_src", f"must be a directory path, got {vllm_src!r}")
    if not isinstance(differential_against_base, bool):
        raise ConfigError("differential_against_base", "must be true or false")
    if differential_against_base and not (patches or vllm_src):
        raise ConfigError("differential_against_base", "needs patched vLLM code to hold "
                          "against the base (--vllm-patch FILE or --vllm-src DIR)")


def read_patch(path: str | Path) -> VllmPatch:
    """A patch file as a descriptor; checked to parse as a unified diff."""
    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("vllm_patch", f"{path}: {getattr(exc, 'strerror', None) or exc}") \
            from None
    try:
        parse_diff(text, p.name)
    except PatchError as exc:
        raise ConfigError("vllm_patch", str(exc)) from None
    return VllmPatch(p.name, content_hash(text), text, str(path))


def patched_files(root: Path, patches: tuple[VllmPatch, ...]) -> dict[str, str]:
    """Relative path -> patched text of every file the patches touch, applied in order to
    private copies read from `root` (a directory holding the `vllm` package)."""
    texts: dict[str, str] = {}
    for patch in patches:
        if patch.diff is None:
            raise ConfigError(FIELD, f"{patch.short} was recorded without its diff; give "
                              f"--vllm-patch FILE with that content")
        try:
            for file_patch in parse_diff(patch.diff, patch.name):
                rel = file_patch.path
                if rel not in texts:
                    texts[rel] = _read_tree_file(root, rel, patch.name)
                texts[rel] = apply_file_patch(texts[rel], file_patch, patch.name)
        except PatchError as exc:
            raise ConfigError("vllm_patch", str(exc)) from None
    return texts


def _read_tree_file(root: Path, rel: str, name: str) -> str:
    target = (root / rel).resolve()
    if not rel.startswith("vllm/") or not rel.endswith(".py") or ".." in Path(rel).parts:
        raise ConfigError("vllm_patch", f"{name}: names {rel}; only Python modules of the "
                          "vllm package (vllm/....py) can be patched")
    if not target.is_file():
        raise ConfigError("vllm_patch", f"{name}: names {rel}, which the vllm at {root} does "
                          "not have")
    return target.read_text()


def module_name(rel: str) -> str:
    """vllm/v1/worker/gpu/dp_utils.py -> vllm.v1.worker.gpu.dp_utils (packages too)."""
    parts = list(Path(rel).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)
