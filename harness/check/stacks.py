"""Where a hung rank's threads are parked, read from the stacks in a world's evidence
(faulthandler dumps, most recent call first): the innermost frame of the code under test."""

from __future__ import annotations

import re

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")


def _rank_section(evidence: str, rank: int) -> str:
    marker = f"--- rank {rank} stacks ---"
    start = evidence.rfind(marker)
    if start < 0:
        return ""
    end = evidence.find("--- rank ", start + len(marker))
    return evidence[start + len(marker):end if end >= 0 else None]


def _last_dump(section: str) -> list[list[str]]:
    """The threads of the section's last dump, each as its frame lines."""
    threads: list[list[str]] = []
    for line in section.splitlines():
        match = _THREAD.match(line.strip())
        if match:
            if match.group(1) == "Thread" and threads and threads[-1][0].startswith("Current"):
                threads = []  # a new dump begins after the previous one's current thread
            threads.append([line.strip()])
        elif threads and line.strip().startswith("File "):
            threads[-1].append(line.strip())
    return threads


def parked_frames(evidence: str, rank: int, package: str = "vllm") -> list[str]:
    """For each thread of `rank` with a frame in `package`, its innermost such frame as
    "path:line (function)", the path from the package on."""
    frames = []
    for thread in _last_dump(_rank_section(evidence, rank)):
        for line in thread[1:]:
            match = _FRAME.search(line)
            if match and f"/{package}/" in match.group("file"):
                path = match.group("file")
                path = path[path.rfind(f"/{package}/") + 1:]
                frames.append(f"{path}:{match.group('line')} ({match.group('func')})")
                break
    return frames
