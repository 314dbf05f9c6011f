"""A strict unified-diff applier, in pure Python (docs/spec.md has no say here: this is input).

A hunk applies where its old lines (context and removals) match the file exactly, and only
where they match once in the whole file: at the line its header names, or up to MAX_OFFSET
lines from it (the file moved). No fuzz, no whitespace leniency. A hunk whose old lines
match twice, only further away, or nowhere is an error naming the patch, the file, the hunk
and where it matched (or the first line that differs). New, deleted, renamed and binary
files are refused: the harness patches modules vLLM has, nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_REFUSED_HEADERS = ("rename from", "rename to", "copy from", "copy to", "new file mode",
                    "deleted file mode", "GIT binary patch", "Binary files")
# An offset like GNU patch's, but bounded: a release's edits above a hunk move it (0.33.0 to
# 0.34.0 moved dp_utils' guard 24 lines); further away, the patch was written for another file.
MAX_OFFSET = 50


class PatchError(ValueError):
    """A diff that cannot be read or applied; the message is one line."""


@dataclass(frozen=True)
class Hunk:
    old_start: int  # 1-based, as in the header
    old_lines: tuple[str, ...]  # context and removed lines, each with its line ending
    new_lines: tuple[str, ...]  # context and added lines
    header: str


@dataclass(frozen=True)
class FilePatch:
    path: str  # relative to the tree's root, e.g. vllm/v1/worker/gpu/dp_utils.py
    hunks: tuple[Hunk, ...]


def _strip_prefix(raw: str) -> str:
    path = raw.split("\t")[0].strip()
    if path.startswith(("a/", "b/")):
        path = path[2:]
    return path


def _line_body(line: str) -> str:
    return line[1:]


def parse_diff(text: str, name: str = "patch") -> tuple[FilePatch, ...]:
    """Every file section of a unified diff (git's or diff -u's), in order."""
    lines = text.splitlines(keepends=True)
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(_REFUSED_HEADERS):
            raise PatchError(f"{name}: line {i + 1}: {line.strip()!r}: only changes to files "
                             "vLLM has can be applied (no new, deleted, renamed or binary files)")
        if not line.startswith("--- "):
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise PatchError(f"{name}: line {i + 1}: '---' without a '+++' line after it")
        old, new = _strip_prefix(line[4:]), _strip_prefix(lines[i + 1][4:])
        if "/dev/null" in (old, new):
            raise PatchError(f"{name}: line {i + 1}: creates or deletes a file; only changes "
                             "to files vLLM has can be applied")
        if old != new:
            raise PatchError(f"{name}: line {i + 1}: renames {old} to {new}; only changes "
                             "in place can be applied")
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and lines[i].startswith("@@"):
            hunk, i = _parse_hunk(lines, i, name)
            hunks.append(hunk)
        if not hunks:
            raise PatchError(f"{name}: {old}: a file header with no hunk after it")
        files.append(FilePatch(old, tuple(hunks)))
    if not files:
        raise PatchError(f"{name}: holds no unified diff (no '--- a/FILE' / '+++ b/FILE' "
                         "section)")
    return tuple(files)


def _parse_hunk(lines: Sequence[str], i: int, name: str) -> tuple[Hunk, int]:
    header = lines[i].rstrip("\r\n")
    match = _HUNK.match(header)
    if not match:
        raise PatchError(f"{name}: line {i + 1}: malformed hunk header {header!r}")
    old_start = int(match.group(1))
    old_count = int(match.group(2) or 1)
    new_count = int(match.group(4) or 1)
    old: list[str] = []
    new: list[str] = []
    j = i + 1
    while j < len(lines) and (len(old) < old_count or len(new) < new_count):
        line = lines[j]
        tag = line[:1]
        if tag == " " or line in ("\n", "\r\n"):  # an empty context line some tools emit
            body = _line_body(line) if tag == " " else line
            old.append(body)
            new.append(body)
        elif tag == "-":
            old.append(_line_body(line))
        elif tag == "+":
            new.append(_line_body(line))
        elif tag == "\\":
            _drop_newline(old, new, lines[j - 1][:1])
        else:
            raise PatchError(f"{name}: line {j + 1}: hunk {header!r} ends after {len(old)} of "
                             f"{old_count} old and {len(new)} of {new_count} new lines")
        j += 1
    if len(old) != old_count or len(new) != new_count:
        raise PatchError(f"{name}: hunk {header!r} is cut short: {len(old)} of {old_count} "
                         f"old and {len(new)} of {new_count} new lines")
    if j < len(lines) and lines[j].startswith("\\"):
        _drop_newline(old, new, lines[j - 1][:1])
        j += 1
    return Hunk(old_start, tuple(old), tuple(new), header), j


def _drop_newline(old: list[str], new: list[str], previous_tag: str) -> None:
    """'\\ No newline at end of file' applies to the line just before it."""
    targets = {"-": (old,), "+": (new,)}.get(previous_tag, (old, new))
    for side in targets:
        if side:
            side[-1] = side[-1].rstrip("\r\n")


def _matches_at(lines: Sequence[str], old: Sequence[str], at: int) -> bool:
    return 0 <= at <= len(lines) - len(old) and list(lines[at:at + len(old)]) == list(old)


def _first_difference(lines: Sequence[str], old: Sequence[str], at: int) -> str:
    for offset, want in enumerate(old):
        got = lines[at + offset] if 0 <= at + offset < len(lines) else "<end of file>"
        if got != want:
            return (f"line {at + offset + 1} is {got.rstrip()!r}, the hunk expects "
                    f"{want.rstrip()!r}")
    return "the file ends before the hunk does"


def apply_file_patch(text: str, patch: FilePatch, name: str = "patch") -> str:
    """`text` with every hunk of `patch` applied, in order; PatchError if one does not fit."""
    lines = text.splitlines(keepends=True)
    shift = 0  # how far earlier hunks moved the lines after them
    floor = 0  # hunks apply in order and never overlap
    for number, hunk in enumerate(patch.hunks, start=1):
        # A zero-length old side names the line after which it inserts.
        stated = hunk.old_start - 1 + shift + (1 if not hunk.old_lines else 0)
        where = f"{name}: hunk {number} of {patch.path} ({hunk.header})"
        at = _place(lines, hunk, stated, floor, where)
        lines[at:at + len(hunk.old_lines)] = list(hunk.new_lines)
        shift += len(hunk.new_lines) - len(hunk.old_lines) + (at - stated)
        floor = at + len(hunk.new_lines)
    return "".join(lines)


def _place(lines: list[str], hunk: Hunk, stated: int, floor: int, where: str) -> int:
    """The one place the hunk's old lines sit, at or near the stated line; else PatchError."""
    if not hunk.old_lines:  # a pure insertion has nothing to find it by but its line
        if floor <= stated <= len(lines):
            return stated
        raise PatchError(f"{where} does not apply: it inserts at line {stated + 1}, past the "
                         "end of the file or above the hunk before it")
    found = [at for at in range(len(lines) - len(hunk.old_lines) + 1)
             if _matches_at(lines, hunk.old_lines, at)]
    if not found:
        why = _first_difference(lines, hunk.old_lines, max(stated, 0))
        raise PatchError(f"{where} does not apply: {why}")
    if len(found) > 1:
        shown = ", ".join(str(at + 1) for at in found[:5]) + (", ..." if found[5:] else "")
        raise PatchError(f"{where} is ambiguous: its old lines match at {len(found)} places "
                         f"(lines {shown}); give it more context so they match once")
    (at,) = found
    if at < floor:
        raise PatchError(f"{where} does not apply: its old lines are at line {at + 1}, "
                         "above the hunk before it")
    if abs(at - stated) > MAX_OFFSET:
        raise PatchError(f"{where} does not apply where it says: its old lines are at line "
                         f"{at + 1}, {abs(at - stated)} lines from line {stated + 1} (at most "
                         f"{MAX_OFFSET}); rebase the patch onto this tree")
    return at
