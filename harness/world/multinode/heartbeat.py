"""Whether a multi-node world's driver still lives, as each node's launcher sees it.

torchrun's agent restarts workers whose driver went away (every rebuild is one of its
restarts), so an agent by itself would outlive a dead driver by up to its restart budget.
The driver beats a counter in the rendezvous store once a second; `python -m
harness.world.node` stops its agent when the counter stands still past a bound, or at once
when a driver on the same host (its pid given) has exited. A driver that ends its world on
purpose says so (`END_KEY`) before its node's agent takes the store down: a node that saw it
ends with 0 however its agent went, since a rendezvous gone then is the normal end.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from harness.world.processes.lifecycle import pid_alive

BEAT_KEY = "dbo-harness/driver-beat"
END_KEY = "dbo-harness/driver-ended"
BEAT_PERIOD_S = 1.0
SILENCE_S = 30.0  # no beat for this long after one was seen: the driver is gone
FIRST_BEAT_S = 600.0  # a node started before its driver waits as long as torchrun's join
STORE_CONNECT_S = 2.0
RETRY_S = 5.0


def _store(host: str, port: int):
    import torch.distributed as dist

    return dist.TCPStore(host, port, is_master=False,
                         timeout=timedelta(seconds=STORE_CONNECT_S))


def store_answers(host: str, port: int) -> bool:
    """Whether the rendezvous store takes a connection now (its host's agent is up)."""
    try:
        _store(host, port)
    except (RuntimeError, OSError, ValueError):  # DistNetworkError is a RuntimeError
        return False
    return True


class DriverBeat:
    """The driver's side: a daemon thread adding 1 to BEAT_KEY every period until stopped.
    The store may not be up yet (its host is an agent), or gone: it tries again."""

    def __init__(self, host: str, port: int, period_s: float = BEAT_PERIOD_S) -> None:
        self._where = (host, port)
        self._period_s = period_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="driver-beat")
        self._thread.start()

    def _beat(self) -> None:
        store = None
        while not self._stopped.is_set():
            wait = self._period_s
            try:
                store = store or _store(*self._where)
                store.add(BEAT_KEY, 1)
            except (RuntimeError, OSError, ValueError):  # DistNetworkError is a RuntimeError
                store, wait = None, RETRY_S  # its host restarting, or gone with the world
            self._stopped.wait(wait)

    def stop(self) -> None:
        self._stopped.set()
        # A thread left in the store's C++ client as the interpreter ends aborts it.
        self._thread.join(4 * STORE_CONNECT_S)

    def end(self) -> None:
        """Stop beating and mark the world ended on purpose (best effort: a store already
        gone has no node left to tell)."""
        self.stop()
        _mark_end(self._where, True)


def clear_end_mark(host: str, port: int) -> None:
    """A driver building a world again after it ended one: the nodes that outlived the end
    (their store is hosted elsewhere) take it back."""
    _mark_end((host, port), False)


def _mark_end(where: tuple[str, int], ended: bool) -> None:
    try:
        store = _store(*where)
        if ended:
            store.set(END_KEY, b"1")
        else:
            store.delete_key(END_KEY)
    except (RuntimeError, OSError, ValueError):
        pass


def driver_silent(now: float, since: float, beat_seen: bool, silence_s: float,
                  first_beat_s: float) -> bool:
    """The driver counts as gone when its beat has stood still since `since` for longer
    than the bound: `silence_s` once a beat was seen, `first_beat_s` before."""
    return now - since > (silence_s if beat_seen else first_beat_s)


class DriverWatch:
    """A node launcher's side: `gone()` says why the driver counts as gone, or None."""

    def __init__(self, host: str, port: int, driver_pid: int | None = None,
                 silence_s: float = SILENCE_S, first_beat_s: float = FIRST_BEAT_S) -> None:
        self._where = (host, port)
        self.driver_pid = driver_pid
        self.silence_s, self.first_beat_s = silence_s, first_beat_s
        self._store = None
        self._count: int | None = None
        self._since = time.monotonic()
        self._seen = False
        self.ended = False  # the driver's end mark, as last read

    def _read(self) -> int | None:
        try:
            self._store = self._store or _store(*self._where)
            self.ended = self._store.check([END_KEY])
            return self._store.add(BEAT_KEY, 0)
        except (RuntimeError, OSError, ValueError):
            self._store = None  # its host is gone or not up yet: no beat
            return None

    def gone(self) -> str | None:
        if self.driver_pid is not None and not pid_alive(self.driver_pid):
            return f"its driver (pid {self.driver_pid}) exited"
        count, now = self._read(), time.monotonic()
        if count is not None and count > 0 and count != self._count:
            self._count, self._since, self._seen = count, now, True
        if driver_silent(now, self._since, self._seen, self.silence_s, self.first_beat_s):
            bound = self.silence_s if self._seen else self.first_beat_s
            return (f"no beat of its driver in the rendezvous store for {bound:.0f} s"
                    + ("" if self._seen else " (none ever)"))
        return None
