"""The files of a world's trace directory, named in one place: the ranks write them, the
driver reads them for evidence after a failure."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TraceLayout:
    dir: Path

    def collectives(self, rank: int) -> Path:
        """The rank's collective trace: a line per collective issued, a header per step."""
        return self.dir / f"collectives-{rank}.txt"

    def stacks(self, rank: int) -> Path:
        """Where a rank process's faulthandler dumps its threads (SIGUSR1, a fatal signal)."""
        return self.dir / f"stacks-{rank}.txt"

    @property
    def torchrun_log(self) -> Path:
        """The torchrun agent's output and its workers' (native aborts land here)."""
        return self.dir / "torchrun.log"

    @property
    def runner_stderr(self) -> Path:
        """The sandboxed sim world's runner process: its native messages (every rank's)."""
        return self.dir / "stderr.txt"

    @property
    def runner_stacks(self) -> Path:
        """The sandboxed runner's faulthandler dumps, every rank thread in one file."""
        return self.dir / "stacks.txt"
