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
    try:
        return tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        kind = path.suffix.lstrip(".").upper() or "JSON"
        raise ConfigError(field, f"{path} is not valid {kind}: {exc}") from None
