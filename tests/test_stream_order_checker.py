"""The stream-order checker over hand-made stream orders (no vLLM needed): a read of what
another stream wrote holds only when an event recorded after the write was waited on before
the read, directly or through a third stream."""

from __future__ import annotations

from harness.check.registry import REGISTRY
from harness.check.stream_order import check_stream_order, first_race
from harness.check.verdict import Outcome
from harness.history.records import StepRecord, StreamOp, VllmExecTrace
from harness.invariants import CheckerName

RECV = "dispatch recv of microbatch 1"


def write(stream: str, tensor: str = RECV, op: str = "all_to_all") -> StreamOp:
    return StreamOp("write", stream, tensor, op)


def read(stream: str, tensor: str = RECV, op: str = "experts") -> StreamOp:
    return StreamOp("read", stream, tensor, op)


def record_on(stream: str, event: str) -> StreamOp:
    return StreamOp("record", stream, event)


def wait_on(stream: str, event: str) -> StreamOp:
    return StreamOp("wait", stream, event)


def step(rank: int, *ops: StreamOp, traced: bool = True) -> StepRecord:
    trace = VllmExecTrace((), (), (), (), tuple(ops)) if traced else None
    return StepRecord(rank=rank, step=3, plan=None, executed="eager-microbatched",
                      captured_split=(), replay_split=(), fingerprint=(), routes=(),
                      outputs=(), state=(), threads_alive=(), pending_run=False, error=None,
                      injected_fault=False, seconds=0.0, vllm_exec=trace)


def test_a_read_on_the_stream_that_wrote_is_ordered_by_program_order():
    ops = (write("comm"), read("comm"))
    assert check_stream_order([step(0, *ops), step(1, *ops)]).outcome is Outcome.HELD


def test_a_read_after_a_wait_on_an_event_recorded_after_the_write_is_ordered():
    ops = (write("comm"), record_on("comm", "e0"), wait_on("compute", "e0"), read("compute"))
    assert check_stream_order([step(0, *ops)]).outcome is Outcome.HELD


def test_a_read_with_no_wait_after_a_write_on_another_stream_fails_naming_both_streams():
    verdict = check_stream_order([step(0, write("comm"), read("comm")),
                                  step(1, write("comm"), record_on("comm", "e0"),
                                       read("compute"))])
    assert verdict.outcome is Outcome.FAILED
    assert verdict.detail == ("rank 1 step 3: experts on stream compute reads dispatch recv of "
                              "microbatch 1, written by all_to_all on stream comm with no event "
                              "wait ordering the write before the read")


def test_a_wait_on_an_event_recorded_before_the_write_does_not_order_it():
    ops = (record_on("comm", "e0"), write("comm"), wait_on("compute", "e0"), read("compute"))
    assert first_race(ops) is not None
    # The same event recorded again after the write does order it.
    again = (*ops[:2], record_on("comm", "e0"), *ops[2:])
    assert first_race(again) is None


def test_a_wait_takes_the_record_issued_before_it_not_a_later_one():
    ops = (write("comm"), wait_on("compute", "e0"), record_on("comm", "e0"), read("compute"))
    assert first_race(ops) is not None


def test_a_wait_on_an_event_never_recorded_orders_nothing():
    assert first_race((write("comm"), wait_on("compute", "e9"), read("compute"))) is not None


def test_order_passes_through_a_third_stream():
    via = (write("comm"), record_on("comm", "e0"), wait_on("side", "e0"),
           record_on("side", "e1"), wait_on("compute", "e1"), read("compute"))
    assert first_race(via) is None
    # The third stream's event recorded before it waited passes nothing on.
    early = (write("comm"), record_on("comm", "e0"), record_on("side", "e1"),
             wait_on("side", "e0"), wait_on("compute", "e1"), read("compute"))
    assert "stream comm" in first_race(early)


def test_a_read_is_judged_against_the_latest_write_of_its_tensor():
    # The writes are ordered (no write-after-write); the read is not after the second one.
    ordered_first = (write("compute"), record_on("compute", "e0"), wait_on("comm", "e0"),
                     write("comm"), read("compute"))
    assert first_race(ordered_first).startswith("experts on stream compute reads")
    other_tensor = (write("comm", "combine recv of microbatch 0"), read("compute"))
    assert first_race(other_tensor) is None  # written in an earlier step: not judged


def test_no_recorded_access_is_not_applicable_and_events_alone_are_not_accesses():
    events_only = step(0, record_on("comm", "e0"), wait_on("compute", "e0"))
    for records in ([step(0, traced=False)], [events_only], [None, events_only]):
        verdict = check_stream_order(records)
        assert verdict.outcome is Outcome.NOT_APPLICABLE
        assert "no tensor access was recorded" in verdict.detail


def test_a_race_is_named_beside_a_rank_that_left_no_record():
    checker = next(c for c in REGISTRY if c.name is CheckerName.STREAM_ORDER)
    assert checker.judges_missing_ranks
    assert not check_stream_order([None, step(1, write("comm"), read("compute"))]).ok


def test_a_wait_placed_on_another_stream_than_the_reader_does_not_order_the_read():
    # Ids gathered on a side stream, joined back to the forward's top stream, read on the
    # microbatch's compute stream.
    ids = "gathered ids"
    gathered = (write("side", ids, "all_gather"), record_on("side", "e0"))
    wrong = (*gathered, wait_on("top", "e0"), read("compute", ids, "hash routing"))
    assert first_race(wrong) == ("hash routing on stream compute reads gathered ids, written "
                                 "by all_gather on stream side with no event wait ordering the "
                                 "write before the read")
    assert first_race((*gathered, wait_on("compute", "e0"), read("compute", ids))) is None


def test_the_missing_compute_wait_switch_needs_vllms_execution():
    import pytest

    from harness.config import HarnessConfig
    from harness.errors import ConfigError

    with pytest.raises(ConfigError, match="^switch_to_compute: switches vLLM's execution code"):
        HarnessConfig.of(switch_to_compute="no-wait")
    planted = HarnessConfig.of(execution="vllm", switch_to_compute="no-wait")
    assert planted.to_dict()["switch_to_compute"] == "no-wait"
    assert "switch_to_compute" not in HarnessConfig.of(execution="vllm").to_dict()


def test_a_write_before_an_earlier_read_on_another_stream_is_done_fails_naming_the_read():
    pack = "dispatch send of microbatch 0"
    reused = (write("compute", pack, "dispatch pack"), record_on("compute", "e0"),
              wait_on("comm", "e0"), read("comm", pack, "all_to_all"),
              write("compute", pack, "dispatch pack"))
    assert first_race(reused) == ("dispatch pack on stream compute writes dispatch send of "
                                  "microbatch 0, read by all_to_all on stream comm with no "
                                  "event wait ordering the read before the write")
    # Ordered once the writer waits for an event the reader recorded after its read.
    waited = (*reused[:4], record_on("comm", "e1"), wait_on("compute", "e1"), reused[4])
    assert first_race(waited) is None


def test_a_write_racing_an_earlier_write_on_another_stream_fails_and_program_order_holds():
    assert first_race((write("comm"), write("comm"), read("comm"))) is None
    assert first_race((write("comm"), write("compute"))) == (
        "all_to_all on stream compute writes dispatch recv of microbatch 1, written by "
        "all_to_all on stream comm with no event wait ordering the two writes")


def test_only_the_reads_since_the_latest_write_are_judged_against_a_write():
    ops = (write("comm"), read("compute"))  # races; judged at the read, not again later
    assert first_race(ops) is not None
    ordered = (write("comm"), record_on("comm", "e0"), wait_on("compute", "e0"),
               read("compute"), record_on("compute", "e1"), wait_on("comm", "e1"),
               write("comm"), read("comm"))
    assert first_race(ordered) is None


IDS, GATHERED = "top-k ids of microbatch 0", "gathered ids of microbatch 0"


def test_an_ids_gather_whose_comm_wait_came_before_the_router_fails_naming_the_gather():
    # ROCm/ATOM PR #1208's race: comm synced with compute before the router wrote the ids.
    early = (record_on("compute", "e0"), wait_on("comm", "e0"),
             write("compute", IDS, "router"), read("comm", IDS, "all_gather"),
             write("comm", GATHERED, "all_gather"), record_on("comm", "e1"),
             wait_on("compute", "e1"), read("compute", GATHERED, "dispatch"))
    assert first_race(early) == ("all_gather on stream comm reads top-k ids of microbatch 0, "
                                 "written by router on stream compute with no event wait "
                                 "ordering the write before the read")
    after = (write("compute", IDS, "router"), *early[:2], *early[3:])
    assert first_race(after) is None


class _Streams:
    """vLLM's dbo stream switches over two named streams, logging events as the stand-ins do."""

    def __init__(self) -> None:
        self.current = "compute"
        self.log = None
        self.events = 0

    def _handoff(self, to: str) -> None:
        event = f"e{self.events}"
        self.events += 1
        self.log.event("record", self.current, event)
        self.current = to
        self.log.event("wait", to, event)

    def dbo_switch_to_comm_sync(self) -> None:
        self._handoff("comm")

    def dbo_switch_to_compute_sync(self) -> None:
        self._handoff("compute")

    def dbo_switch_to_comm(self) -> None:
        self.current = "comm"

    def dbo_switch_to_compute(self) -> None:
        self.current = "compute"


def gathered_order(wait: str):
    """The stream order the miniature's ids exchange logs for one microbatch on 2 ranks."""
    import torch

    from harness.bug_switches import IdsGatherWait
    from harness.vllm_exec.ids_gather import IdsGather
    from harness.vllm_exec.stream_log import StreamLog

    streams = _Streams()
    streams.log = StreamLog(lambda: type("S", (), {"name": streams.current})())
    mark = streams.log.mark()

    def all_gather(out, inp):  # rank 0 of 2: its own row, then the peer's
        out.view(2, -1).copy_(torch.stack([inp, inp + 100]))

    ids = IdsGather(all_gather, streams, streams.log, 0, 2, 8, IdsGatherWait(wait),
                    torch.device("cpu"))
    ids.before_routing()
    topk = torch.tensor([[1, 3], [0, -1]])
    routed = ids.exchange(0, topk)
    assert routed.tolist() == topk.tolist() and streams.current == "compute"
    return streams.log.since(mark)


def test_the_miniatures_ids_exchange_logs_a_race_only_with_the_wait_before_the_router():
    assert first_race(gathered_order("after-routing")) is None
    early = gathered_order("before-routing")
    assert first_race(early).startswith("all_gather on stream comm reads top-k ids of "
                                        "microbatch 0, written by router on stream compute")
    # A wait was issued on the comm stream all the same: its event predates the write.
    assert [op.kind for op in early[:2]] == ["record", "wait"]
