"""A rank's failure as data: what error_of keeps of an exception."""

import traceback
from types import SimpleNamespace

from harness.history.step_error import error_of


def access(stream: int, operator: str, kind: str, *frames: tuple[str, int, str]):
    trace = traceback.StackSummary.from_list(
        [traceback.FrameSummary(f, line, name, lookup_line=False) for f, line, name in frames])
    return SimpleNamespace(stream=stream, operator=operator, type=kind, stack_trace=trace)


class SanitizerErrors(Exception):
    """Shaped as torch.cuda._sanitizer.CUDASanitizerErrors: a list of races in `errors`."""

    def __init__(self, errors):
        self.errors = errors
        super().__init__(f"detected {len(errors)} errors")


def test_a_sanitizer_race_names_both_streams_operators_and_our_innermost_frames():
    race = SimpleNamespace(
        current_access=access(0, "aten::copy_(Tensor(a!) self, Tensor src) -> Tensor(a!)",
                              "writing to", ("/x/harness/vllm_exec/runtime.py", 144, "reset_state"),
                              ("/x/torch/_tensor.py", 9, "copy_")),
        previous_access=access(7, "aten::index_add_", "writing to",
                               ("/x/harness/vllm_exec/mini_moe.py", 80, "attention")))
    error = error_of(SanitizerErrors([race]))
    assert error.kind == "SanitizerErrors"
    assert error.message == (
        "detected 1 errors: stream 0 aten::copy_ writing to at vllm_exec/runtime.py:144 "
        "(reset_state) races stream 7 aten::index_add_ writing to at "
        "vllm_exec/mini_moe.py:80 (attention)")


def test_an_ordinary_exception_keeps_its_first_line_and_its_cause():
    try:
        try:
            raise KeyError("slot")
        except KeyError as inner:
            raise RuntimeError("step failed\nmore detail") from inner
    except RuntimeError as exc:
        error = error_of(exc)
    assert (error.kind, error.message, error.cause) == ("RuntimeError", "step failed",
                                                        "KeyError: 'slot'")
