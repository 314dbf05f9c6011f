"""The type-hint codec's fast path for plain rows must check as much as the slow one."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from harness.errors import ConfigError
from harness.history.codec import decode, encode


@dataclass(frozen=True)
class Rows:
    rows: tuple[tuple[float, ...], ...]
    route: tuple[int, int, int]


def test_plain_rows_decode_to_tuples_equal_to_what_was_encoded():
    value = Rows(((1.0, 2.5), (3.0, -0.5)), (0, 1, 2))
    assert decode(encode(value, Rows), Rows) == value


def test_a_non_finite_value_in_a_row_still_takes_the_checked_way_back():
    value = Rows(((1.0, math.inf), (math.nan, 0.0)), (0, 1, 2))
    back = decode(encode(value, Rows), Rows)
    assert back.rows[0] == (1.0, math.inf) and math.isnan(back.rows[1][0])


def test_a_string_in_a_row_is_named_by_its_full_path():
    with pytest.raises(ConfigError) as error:
        decode({"rows": [[1.0, 2.0], [3.0, "x"]], "route": [0, 1, 2]}, Rows)
    assert error.value.field == "rows[1][1]"


def test_a_boolean_is_no_integer_and_a_route_of_the_wrong_length_is_refused():
    with pytest.raises(ConfigError) as error:
        decode({"rows": [], "route": [0, True, 2]}, Rows)
    assert error.value.field == "route[1]"
    with pytest.raises(ConfigError) as error:
        decode({"rows": [], "route": [0, 1]}, Rows)
    assert error.value.field == "route"


def test_integers_in_a_float_row_read_as_floats():
    back = decode({"rows": [[1, 2.0]], "route": [0, 1, 2]}, Rows)
    assert back.rows == ((1.0, 2.0),) and all(type(v) is float for v in back.rows[0])
