"""Which vLLM a run tested: its version, where its tree is, and the git commit of a checkout.
Read from files only (no git binary, no import of vLLM)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_VERSION = re.compile(r"""^(?:__version__|version)\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""",
                      re.MULTILINE)


@dataclass(frozen=True)
class VllmIdentity:
    version: str
    path: str  # the directory holding the `vllm` package
    commit: str | None
    patches: tuple[str, ...] = ()  # "name (sha256 prefix)" of each patch applied over it

    def describe(self) -> str:
        commit = f", git {self.commit[:12]}" if self.commit else ""
        patched = f", patched with {', '.join(self.patches)}" if self.patches else ""
        return f"vllm {self.version} at {self.path}{commit}{patched}"

    def to_dict(self) -> dict[str, object]:
        return {"version": self.version, "path": self.path, "commit": self.commit,
                "patches": list(self.patches)}


def tree_version(root: Path, imported_version: str | None = None) -> str:
    """The version a tree declares (its generated _version.py), else the one given."""
    version_file = root / "vllm" / "_version.py"
    if version_file.is_file():
        match = _VERSION.search(version_file.read_text(errors="replace"))
        if match:
            return match.group(1)
    return imported_version or "unknown"


def git_commit(root: Path) -> str | None:
    """HEAD's commit when `root` (the directory holding `vllm/`) is a checkout's top, else
    None. Parents are not searched: site-packages inside some repository is no checkout."""
    dot_git = root / ".git"
    if dot_git.is_file():  # a worktree or submodule: "gitdir: PATH"
        text = dot_git.read_text().strip()
        if not text.startswith("gitdir:"):
            return None
        return _resolve_head((root / text.split(":", 1)[1].strip()).resolve())
    if dot_git.is_dir():
        return _resolve_head(dot_git)
    return None


def _resolve_head(git_dir: Path) -> str | None:
    try:
        head = (git_dir / "HEAD").read_text().strip()
    except OSError:
        return None
    if not head.startswith("ref:"):
        return head or None
    ref = head.split(":", 1)[1].strip()
    common = git_dir
    commondir = git_dir / "commondir"  # worktrees keep shared refs elsewhere
    if commondir.is_file():
        common = (git_dir / commondir.read_text().strip()).resolve()
    for base in (git_dir, common):
        loose = base / ref
        if loose.is_file():
            return loose.read_text().strip() or None
    packed = common / "packed-refs"
    if packed.is_file():
        for line in packed.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] == ref:
                return parts[0]
    return None
