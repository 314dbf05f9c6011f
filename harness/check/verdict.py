"""A checker's verdict: which invariant, whether it held, and on failure where and why."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    checker: str
    ok: bool
    detail: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"checker": self.checker, "ok": self.ok, "detail": self.detail}


def _ok(name: str, detail: str = "") -> Verdict:
    return Verdict(name, True, detail)


def _fail(name: str, detail: str) -> Verdict:
    return Verdict(name, False, detail)
