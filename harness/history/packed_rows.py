"""Rows of floats packed for the wire: a rectangular block of finite float64 values as one
hex string of their little-endian bytes, instead of a JSON number per value.

A step record carries about two thousand floats (its output rows and the whole state cache);
writing each as the shortest decimal that reads back, and parsing it again, took 1.2 ms per
record on a rank and 0.8 ms on the driver. The bytes read back bit for bit. Only blocks of
floats that are all finite are packed, so a record decodes to exactly what the JSON numbers
gave (a NaN keeps its "NaN" form and reads back as Python's one NaN).
"""

from __future__ import annotations

import math
import struct
from itertools import chain
from typing import Any

KEYS = frozenset({"rows", "width", "float64"})


def pack(rows: tuple[tuple[float, ...], ...]) -> dict[str, Any] | None:
    """The packed form of `rows`; None when they are not a rectangular block of finite
    floats (then they go as JSON lists)."""
    if not rows:
        return None
    width = len(rows[0])
    if not width or any(len(row) != width for row in rows):
        return None
    flat = list(chain.from_iterable(rows))
    # A sum of floats is finite only when every one of them is.
    if set(map(type, flat)) != {float} or not math.isfinite(sum(flat)):
        return None
    return {"rows": len(rows), "width": width,
            "float64": struct.pack(f"<{len(flat)}d", *flat).hex()}


def is_packed(data: Any) -> bool:
    return type(data) is dict and data.keys() == KEYS


def unpack(data: dict[str, Any]) -> tuple[tuple[float, ...], ...] | str:
    """The rows of a packed block; a string saying what is wrong with it otherwise."""
    rows, width, text = data["rows"], data["width"], data["float64"]
    if not all(type(n) is int and n > 0 for n in (rows, width)):
        return "a packed block whose rows and width are positive counts"
    try:
        raw = bytes.fromhex(text) if isinstance(text, str) else None
    except ValueError:
        raw = None
    if raw is None or len(raw) != 8 * rows * width:
        return f"a packed block of {rows} x {width} float64 values in hex"
    return tuple(struct.iter_unpack(f"<{width}d", raw))
