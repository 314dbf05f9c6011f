"""`Schedule`: which thread runs at each handoff of a rank's microbatch threads, as plain data.

`os` leaves the choice to the operating system (no control: today's behaviour). The other
modes run one thread at a time and pick the next at every scheduling point: `random` (seeded),
`pct` (priorities with `depth` - 1 change points over about `steps` points, seeded) and
`exhaustive` (every schedule with at most `preemptions` preemptions: `explore` walks them all,
one run at a time; a single run takes the one its `seed` numbers, harness/runtime/schedule/
bounded.py).
`choices`, when given, is followed first: the chosen thread at each point where two or more
could run, so a recorded run replays exactly; past its end the mode decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from harness.errors import ConfigError
from harness.runtime.schedule.bounded import schedules_within

MODES = ("os", "random", "pct", "exhaustive")
CONTROLLED_MODES = MODES[1:]
_INT_FIELDS = ("seed", "depth", "preemptions", "steps")


def _field_error(name: str, message: str) -> ConfigError:
    return ConfigError(f"schedule.{name}", message)


@dataclass(frozen=True)
class Schedule:
    mode: str = "os"
    seed: int = 0
    depth: int = 3  # pct: the bug depth aimed at (depth - 1 priority change points)
    preemptions: int = 2  # exhaustive: the preemption bound
    steps: int = 100  # pct: the scheduling points one run is expected to take
    choices: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise _field_error("mode", f"{self.mode!r} is not one of {', '.join(MODES)}")
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise _field_error(name, f"expected an integer, got {value!r}")
        for name, low in (("seed", 0), ("depth", 1), ("preemptions", 0), ("steps", 1)):
            if getattr(self, name) < low:
                raise _field_error(name, f"must be at least {low}, got {getattr(self, name)}")
        if self.mode == "exhaustive" and self.seed >= (
                count := schedules_within(self.preemptions, self.steps)):
            raise _field_error("seed", f"exhaustive numbers its {count} schedules 0 to "
                                       f"{count - 1} (at most {self.preemptions} preemptions "
                                       f"over {self.steps} opportunities), got {self.seed}")
        if self.choices is not None:
            self._check_choices()

    def _check_choices(self) -> None:
        if self.mode == "os":
            raise _field_error("choices", "only a controlled schedule (random, pct, "
                                          "exhaustive) replays choices")
        if not isinstance(self.choices, tuple) or not all(
                isinstance(c, int) and not isinstance(c, bool) and c >= 0
                for c in self.choices):
            raise _field_error("choices", "expected a list of thread numbers (integers >= 0)")

    @property
    def controlled(self) -> bool:
        return self.mode != "os"

    def with_choices(self, choices: tuple[int, ...] | None) -> Schedule:
        return replace(self, choices=None if choices is None else tuple(choices))

    def to_json(self) -> dict[str, Any]:
        """Plain JSON; `choices` only when present."""
        data = asdict(self)
        if self.choices is None:
            del data["choices"]
        else:
            data["choices"] = list(self.choices)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Schedule:
        """The inverse of `to_json`; a bad or unknown field raises `ConfigError` naming it."""
        if not isinstance(data, Mapping):
            raise ConfigError("schedule", f"expected an object, got {type(data).__name__}")
        known = {*_INT_FIELDS, "mode", "choices"}
        for key in data:
            if key not in known:
                raise _field_error(str(key), "unknown field")
        fields = dict(data)
        choices = fields.pop("choices", None)
        if choices is not None:
            if not isinstance(choices, list | tuple):
                raise _field_error("choices", "expected a list of thread numbers")
            choices = tuple(choices)
        return cls(**fields, choices=choices)


OS_SCHEDULE = Schedule()  # no control: the default of every scenario and step
