"""The processes of a world: how workers find this package, and how they are stopped."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def package_pythonpath() -> str:
    root = str(Path(__file__).resolve().parents[2])
    existing = os.environ.get("PYTHONPATH")
    return f"{root}{os.pathsep}{existing}" if existing else root


def wait_or_signal(proc: subprocess.Popen, timeout_s: float, sig: int) -> None:
    try:
        proc.wait(timeout=timeout_s)
        return
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass


def kill_all(pids: list[int]) -> list[int]:
    """SIGKILL every pid still alive (workers run in their own sessions), then confirm."""
    import psutil

    alive = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            proc.kill()
            proc.wait(timeout=5)
        except psutil.NoSuchProcess:
            continue
        except psutil.TimeoutExpired:
            alive.append(pid)
    return [pid for pid in alive if psutil.pid_exists(pid)]


def pid_alive(pid: int) -> bool:
    """Whether `pid` exists (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
