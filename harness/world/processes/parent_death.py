"""Processes that die with their parent, whatever they are doing.

A worker's watchdog thread needs the GIL, and a rank spinning in a CUDA or NCCL wait can
hold it forever: seen on the H200, a rank whose peer was gone kept its torchrun agent and a
GPU context alive for minutes after its driver was killed. The kernel's parent-death signal
(Linux `PR_SET_PDEATHSIG`) needs no cooperation from the process.
"""

from __future__ import annotations

import ctypes
import os
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, sig: int) -> bool:
    """Have the kernel send `sig` to this process when its parent dies; exit now if that
    already happened. False where the platform has no such signal (the watchdogs remain).

    The kernel ties the signal to the parent *thread* that forked: a parent must start
    such a child from a thread that lives as long as the child is wanted.
    """
    armed = False
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        armed = libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    if os.getppid() != parent_pid:
        os._exit(3)
    return armed
