"""A one-line progress bar on stderr for long fuzz runs; silent when stderr is no terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 24
SHOW_AFTER_S = 1.0  # short runs print nothing
REFRESH_S = 0.2


class ProgressBar:
    def __init__(self, label: str, seconds: float | None, examples: int | None,
                 stream: TextIO | None = None, force: bool = False) -> None:
        self.label = label
        self.seconds = seconds
        self.examples = examples
        self.stream = stream or sys.stderr
        self.enabled = force or self.stream.isatty()
        self._last = 0.0
        self._drawn = False

    def update(self, examples: int, elapsed: float, found: bool) -> None:
        now = time.monotonic()
        if not self.enabled or elapsed < SHOW_AFTER_S or now - self._last < REFRESH_S:
            return
        self._last = now
        fractions = [elapsed / self.seconds if self.seconds else 0.0,
                     examples / self.examples if self.examples else 0.0]
        done = min(1.0, max(fractions))
        filled = int(done * WIDTH)
        state = "found, shrinking" if found else "searching"
        self.stream.write(f"\r{self.label}: [{'#' * filled}{'.' * (WIDTH - filled)}] "
                          f"{examples} examples {elapsed:5.1f} s  {state}\033[K")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
