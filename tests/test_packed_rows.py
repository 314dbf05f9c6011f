"""Float rows on the wire go as one packed block each and come back bit for bit; rows that are
not a block of finite floats go as JSON numbers, as before; a malformed block is refused in
one line naming the field; history files keep their plain JSON rows."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import replace

import pytest
import record_builders as rb

from harness.history.codec import decode, encode
from harness.history.records import StepRecord
from harness.world.channel import messages as m

# Values whose shortest decimal form is long or odd: bits must survive, not just values.
ODD = ((-0.0, 5e-324, 1.7976931348623157e308), (0.1, -2.5, 1 / 3))


def bits(rows) -> list[list[int]]:
    return [[struct.unpack("<Q", struct.pack("<d", v))[0] for v in row] for row in rows]


def wire_record(record: StepRecord) -> dict:
    return json.loads(m.to_wire(m.StepReport(0, record)))["fields"]["record"]


def test_a_records_float_rows_cross_the_wire_packed_and_come_back_bit_for_bit():
    record = replace(rb.step_records(2)[0], outputs=ODD, state=ODD[:1])
    sent = wire_record(record)
    assert sent["outputs"].keys() == {"rows", "width", "float64"}  # no JSON number per value
    assert sent["outputs"]["rows"] == 2 and sent["outputs"]["width"] == 3
    back = m.from_wire(m.to_wire(m.StepReport(0, record))).record
    assert back == record and bits(back.outputs) == bits(ODD)
    assert all(type(v) is float for row in back.outputs for v in row)


@pytest.mark.parametrize("rows", [((1.0, math.nan),), ((math.inf, 0.0),), ((1.0,), (2.0, 3.0)),
                                  ((1, 2.0),), ()])
def test_rows_that_are_no_block_of_finite_floats_go_as_json_lists(rows):
    sent = wire_record(replace(rb.step_records(2)[0], outputs=rows))
    assert isinstance(sent["outputs"], list) and len(sent["outputs"]) == len(rows)


@pytest.mark.parametrize("block, says", [
    ({"rows": 1, "width": 2, "float64": "00" * 15}, "1 x 2 float64 values"),
    ({"rows": 1, "width": 2, "float64": "zz" * 16}, "1 x 2 float64 values"),
    ({"rows": 1, "width": 2, "float64": 7}, "1 x 2 float64 values"),
    ({"rows": True, "width": 2, "float64": "00" * 16}, "positive counts"),
    ({"rows": 1, "width": 0, "float64": ""}, "positive counts"),
])
def test_a_malformed_packed_block_is_refused_in_one_line_naming_the_field(block, says):
    fields = {"index": 0, "record": {**wire_record(rb.step_records(2)[0]), "outputs": block}}
    with pytest.raises(m.ProtocolError) as refused:
        m.from_wire(json.dumps({"kind": "StepReport", "fields": fields}).encode())
    assert refused.value.field == "StepReport.record.outputs"
    assert says in refused.value.message and "\n" not in str(refused.value)


def test_rows_encoded_for_a_file_stay_json_numbers_and_both_forms_decode_alike():
    record = replace(rb.step_records(2)[0], outputs=ODD)
    plain, packed = encode(record, StepRecord), encode(record, StepRecord, pack=True)
    assert plain["outputs"] == [list(row) for row in ODD] and isinstance(packed["outputs"], dict)
    assert decode(plain, StepRecord) == decode(packed, StepRecord) == record
