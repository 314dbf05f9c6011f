"""Reading the project's data files (configs, scenarios): JSON, or TOML by extension."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from harness.errors import ConfigError


def read_data_file(path: str | Path, field: str) -> Any:
    """The parsed file; a missing or malformed one is a ConfigError naming `field`."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(field, f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(field, f"{path} is not UTF-8 text") from None
    kind = "TOML" if path.suffix == ".toml" else "JSON"
    try:
        if kind == "TOML":
            return tomllib.loads(text)
        return json.loads(text, object_pairs_hook=_unique_keys)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(field, f"{path} is not valid {kind}: {exc}") from None
    except _DuplicateKey as exc:
        # JSON would keep the last value silently; TOML already refuses a repeated key.
        raise ConfigError(field, f"{path} gives `{exc.key}` twice in one object") from None


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out
