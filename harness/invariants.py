"""The checkers by name: the one declaration every list of checker names derives from
(the registry, harness/check/registry.py, binds each to its function and phase; scenario
files name them in `expect.caught_by`). docs/spec.md §8 says what each holds."""

from __future__ import annotations

from enum import StrEnum


class CheckerName(StrEnum):
    # start-up: capture on every rank
    STARTUP = "startup"
    CAPTURE_HYGIENE = "capture_hygiene"
    GRAPHS_CAPTURE_WORK = "graphs_capture_work"
    CAPTURE_SYMMETRY = "capture_symmetry"
    GRAPHS_REACHABLE = "graphs_reachable"
    # each step, across ranks
    LIVENESS = "liveness"
    ERRORS = "errors"
    AGREEMENT = "agreement"
    COLLECTIVE_FINGERPRINTS = "collective_fingerprints"
    CAPTURED_SPLIT = "captured_split"
    NO_EMPTY_REGION = "no_empty_region"
    MATCHES_REFERENCE = "matches_reference"
    ROUTING_PROVENANCE = "routing_provenance"
    THREAD_HYGIENE = "thread_hygiene"
    # what each rank ran against its plan (harness/check/execution.py)
    EXECUTES_PLAN = "executes_plan"
    EAGER_SLICES = "eager_slices"
    SPLIT_CONSENSUS = "split_consensus"
    DISPATCH_CAPACITY = "dispatch_capacity"
    FRESH_RECEIVE = "fresh_receive"
    TOKENS_IN_THEIR_REQUESTS = "tokens_in_their_requests"  # harness/check/token_cover.py
    DEAD_SLOTS_LEFT_OUT = "dead_slots_left_out"  # harness/check/dead_slots.py
    # steps on vLLM's own execution code (harness/check/vllm_exec.py)
    UBATCHING_STATE = "ubatching_state"
    RECV_BEFORE_READ = "recv_before_read"
    STREAM_ORDER = "stream_order"  # harness/check/stream_order.py
    # decisions against another statement of them
    DIFFERENTIAL_BASE = "differential_base"
    DIFFERENTIAL = "differential"
    SPEC_DECISION = "spec_decision"
    # the whole scenario, over every step's records at once (harness/check/whole_run.py)
    STEPS_COMPLETE = "steps_complete"
