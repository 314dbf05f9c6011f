"""Frozen records as plain JSON, read from their type hints: a dataclass is an object of its
fields, a tuple a list, an enum its member's name, a float a number (or "NaN", "Infinity",
"-Infinity", which JSON has no number for). Decoding checks every value against its hint,
so a malformed file is a ConfigError naming where the bad value sits."""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import types
import typing
from itertools import chain
from typing import Any, Union

from harness.errors import ConfigError
from harness.history import packed_rows

NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_LEAVES = (bool, int, float, str)


class ConfigErrorAt(ConfigError):
    """A ConfigError whose field already names the whole path to the bad value."""


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """A dataclass's init fields and their resolved type hints, in field order."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


@functools.cache
def _required(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls) if f.init
                     and f.default is dataclasses.MISSING
                     and f.default_factory is dataclasses.MISSING)


def _optional(hint: Any) -> Any | None:
    """X for a hint `X | None`; None for any other hint. Only unions with None are stored."""
    if typing.get_origin(hint) not in (Union, types.UnionType):
        return None
    arms = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(arms) != 1 or len(typing.get_args(hint)) != 2:
        raise TypeError(f"no JSON form for the union {hint!r}")
    return arms[0]


def _items(hint: Any, count: int) -> tuple[Any, ...]:
    """The hint of each item of a tuple of `count` items (`tuple[X, ...]` or `tuple[A, B]`)."""
    args = typing.get_args(hint)
    if len(args) == 2 and args[1] is Ellipsis:
        return (args[0],) * count
    return args


def _leaf_items(hint: Any) -> tuple[type, int | None] | None:
    """(float or int, how many: None for any) for a tuple of only those (`tuple[float, ...]`,
    `tuple[int, int]`); None for any other tuple."""
    args = typing.get_args(hint)
    kinds = {a for a in args if a is not Ellipsis}
    if len(kinds) != 1 or not kinds <= {float, int}:
        return None
    return kinds.pop(), None if Ellipsis in args else len(args)


@functools.cache
def _shape(hint: Any) -> tuple[str, Any]:
    """How values of `hint` are stored, worked out once: a record crossing the wire holds
    thousands of values, rows of outputs and routes (a tuple of leaves) most of them."""
    if hint is Any:
        return "any", None
    arm = _optional(hint)
    if arm is not None:
        return "optional", arm
    if dataclasses.is_dataclass(hint):
        return "record", None
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "enum", None
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            item, leaves = _shape(args[0])
            if item == "tuple" and leaves is not None:
                # Rows of leaves (output rows, routes): read and written in bulk, and rows of
                # floats packed on the wire when asked.
                return "leaf_rows", (args[0], *leaves)
        return "tuple", _leaf_items(hint)
    if hint in _LEAVES:
        return "leaf", None
    raise TypeError(f"no JSON form for {hint!r}")


def encode(value: Any, hint: Any, pack: bool = False) -> Any:
    """`value`, of type `hint`, as plain JSON data; with `pack`, rows of finite floats as
    one packed block each (harness/history/packed_rows.py), which `decode` reads too."""
    kind, arg = _shape(hint)
    if kind == "leaf":
        if hint is float and not math.isfinite(value):
            return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
        return value
    if kind == "any":
        return value  # already plain JSON data (e.g. a vLLM identity object)
    if kind == "optional":
        return None if value is None else encode(value, arg, pack)
    if kind == "record":
        return {name: encode(getattr(value, name), h, pack) for name, h in _hints(hint).items()}
    if kind == "enum":
        return value.name
    if kind == "leaf_rows":
        return _encode_rows(value, *arg, pack)
    if arg is not None and arg[0] is float:
        if all(map(math.isfinite, value)):  # a row of plain numbers, as almost every row is
            return list(value)
        return [v if math.isfinite(v) else encode(v, float) for v in value]
    if arg is not None:
        return list(value)
    return [encode(v, h, pack) for v, h in zip(value, _items(hint, len(value)), strict=True)]


def _at(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def decode(data: Any, hint: Any, where: str = "") -> Any:
    """The value of type `hint` that `encode` gave `data` for; `where` names it in errors."""
    kind, arg = _shape(hint)
    if kind == "leaf":
        return data if type(data) is hint else _decode_leaf(data, hint, where)
    if kind == "any":
        return data
    if kind == "optional":
        return None if data is None else decode(data, arg, where)
    if kind == "record":
        return _decode_fields(data, hint, where)
    if kind == "enum":
        if not isinstance(data, str) or data not in hint.__members__:
            raise _wrong(where, f"one of {', '.join(hint.__members__)}", data)
        return hint[data]
    if kind == "leaf_rows" and arg[1] is float and packed_rows.is_packed(data):
        rows = packed_rows.unpack(data)
        if isinstance(rows, str):
            raise _wrong(where, rows, data)
        return rows
    if not isinstance(data, list):
        raise _wrong(where, "a list", data)
    if kind == "leaf_rows" and _plain_rows(data, arg[1], arg[2]):
        return tuple(map(tuple, data))
    fast = _plain(data, hint)
    if fast is not None:
        return fast
    items = _items(hint, len(data))
    if len(items) != len(data):
        raise _wrong(where, f"a list of {len(items)} items", data)
    decoded = []
    for i, (v, h) in enumerate(zip(data, items, strict=True)):
        # Most items (rows, routes, counts) need no conversion: no path is built for them.
        item = _plain(v, h)
        decoded.append(decode(v, h, f"{where}[{i}]") if item is None else item)
    return tuple(decoded)


def _encode_rows(value: Any, item: Any, leaf: type, count: int | None, pack: bool) -> Any:
    """Rows of leaves as `encode` gives each row (a row of plain numbers as a list)."""
    if leaf is not float:
        return [list(row) for row in value]
    packed = packed_rows.pack(value) if pack else None
    if packed is not None:
        return packed
    return [list(row) if all(map(math.isfinite, row)) else encode(row, item) for row in value]


def _plain_rows(data: list, leaf: type, count: int | None) -> bool:
    """Whether every row of `data` is a list of `count` (any, for None) leaves of exactly
    type `leaf`: then it decodes as it is, as `_plain` would find row by row."""
    return (set(map(type, data)) <= {list} and (count is None or set(map(len, data)) <= {count})
            and set(map(type, chain.from_iterable(data))) <= {leaf})


def _plain(data: Any, hint: Any) -> Any:
    """`data` as it decodes when it needs no conversion (a leaf of its exact type, a list of
    only such leaves for a tuple of them); None when it must go the checked way."""
    kind, arg = _shape(hint)
    if kind == "leaf":
        return data if type(data) is hint else None
    if (kind == "tuple" and arg is not None and type(data) is list
            and arg[1] in (None, len(data)) and set(map(type, data)) <= {arg[0]}):
        return tuple(data)
    return None


def _decode_fields(data: Any, cls: type, where: str) -> Any:
    if not isinstance(data, dict):
        raise _wrong(where, f"an object of {cls.__name__} fields", data)
    hints = _hints(cls)
    unknown = sorted(set(data) - set(hints))
    if unknown:
        raise ConfigErrorAt(_at(where, unknown[0]), f"is not a field of {cls.__name__}")
    missing = sorted(_required(cls) - set(data))
    if missing:
        raise ConfigErrorAt(_at(where, missing[0]), "is missing")
    kwargs = {name: decode(data[name], h, _at(where, name))
              for name, h in hints.items() if name in data}
    try:
        return cls(**kwargs)
    except ConfigError as exc:  # the record's own validation (e.g. Timeouts' ordering)
        raise ConfigErrorAt(_at(where, exc.field), exc.message) from None


def _decode_leaf(data: Any, hint: Any, where: str) -> Any:
    if hint is float:
        if isinstance(data, str) and data in NON_FINITE:
            return NON_FINITE[data]
        if isinstance(data, int | float) and not isinstance(data, bool):
            return float(data)
        raise _wrong(where, "a number", data)
    if hint is int and isinstance(data, bool):
        raise _wrong(where, "an integer", data)
    if hint in _LEAVES and isinstance(data, hint):
        return data
    if hint in _LEAVES:
        raise _wrong(where, {int: "an integer", str: "a string", bool: "true or false"}[hint],
                     data)
    raise TypeError(f"no JSON form for {hint!r}")


def _wrong(where: str, expected: str, data: Any) -> ConfigErrorAt:
    shown = repr(data)
    return ConfigErrorAt(where or "value", f"must be {expected}, got "
                         f"{shown if len(shown) <= 40 else shown[:37] + '...'}")

