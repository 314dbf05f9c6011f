"""Step checkers: pure functions over every rank's records (and the reference) to
judgements, named and run by the registry (harness/check/registry.py).

Each holds an invariant of docs/spec.md §8, and on failure names the rank(s) and the first
offending value, so a report says which input broke what where.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from harness.check.agreement import first_disagreement
from harness.check.reference import ReferenceRows
from harness.check.stacks import parked_frames
from harness.check.verdict import Judgement, failed, held, not_applicable
from harness.check.vllm_exec import microbatch_crash
from harness.errors import ErrorOrigin
from harness.history.decision import StepPlan
from harness.history.records import Rows, StepRecord, rows_tensor
from harness.history.step_error import StepError
from harness.model.reference import mismatched_rows

TOLERANCE = 1e-9
# What a rank with an injected fault may fail with: the fault, its kill, or the microbatch
# runner's report of which microbatch it broke.
NAMED_FAULT_ERRORS = ("InjectedFault", "RankKilled", "RankCrashed", "MicrobatchFailed")
# How vLLM's UBatchRunner names the microbatch that broke a run ("Microbatch 0 of 2 failed").
VLLM_RUNNER_REPORT = re.compile(r"Microbatch (\d+) of \d+ failed")
NO_PLAN = "no rank decided the step: each failed before its DP sync returned"


def check_liveness(records: Sequence[StepRecord | None], deadline_s: float,
                   evidence: str = "") -> Judgement:
    """Every rank finished the step within its deadline, and none reported a hang. A stuck
    rank's threads parked in vLLM's code are named by their innermost vLLM frame."""
    stuck = [r for r, rec in enumerate(records) if rec is None]
    if stuck:
        parked = [f"rank {r} parked at {', '.join(frames)}" for r in stuck
                  if (frames := parked_frames(evidence, r))]
        return failed(f"ranks {stuck} still running after the {deadline_s:.1f} s deadline"
                     + (f"; {'; '.join(parked)}" if parked else ""))
    for rec in records:
        if rec.error is not None and rec.error.origin is ErrorOrigin.HANG:
            return failed(f"rank {rec.rank} hung: {rec.error.describe()}")
        if rec.seconds > deadline_s:
            return failed(f"rank {rec.rank} took {rec.seconds:.2f} s, over the "
                         f"{deadline_s:.1f} s deadline")
    return held()


def check_errors(records: Sequence[StepRecord | None]) -> Judgement:
    """No rank failed, except where a fault was injected: there the faulty microbatch must be
    named (a MicrobatchFailed caused by the injected fault), and the peers may only time out
    in the collective it never joined (or lose their process to torchrun), or report under
    vLLM's runner a microbatch that failed only as a consequence."""
    present = [r for r in records if r is not None]
    if not present:
        return not_applicable("no rank reported: liveness judges the silent ranks")
    crash = microbatch_crash(present)  # under vLLM's runner, which reports only one
    if crash is not None:
        return failed(crash)
    # A rank that never reported (it hung or died) is one its peers may have waited on.
    faulted = any(r.injected_fault for r in present) or len(present) < len(records)
    # A rank that timed out waited on another: name the one that failed first, if any did.
    for rec in sorted(present, key=_waited_on_another):
        err = rec.error
        if err is None:
            continue
        if not faulted:
            return failed(f"rank {rec.rank}: {err.describe()}")
        if rec.injected_fault:
            if not _names_the_fault(err) and not _silent_fault_timed_out(rec):
                return failed(f"rank {rec.rank}: the injected fault surfaced as "
                             f"{err.describe()}")
        elif not _waited_on_another(rec) and not _reports_a_consequence(rec):
            return failed(f"rank {rec.rank} (a peer of the faulty rank): {err.describe()}")
    return held(_what_was_contained(records))


def _what_was_contained(records: Sequence[StepRecord | None]) -> str:
    """What the held verdict forgave: an injected fault, or only waits on a silent rank."""
    errors = ", ".join(f"rank {r.rank} {r.error.kind}" for r in records
                       if r is not None and r.error is not None)
    if not errors:
        return ""
    if any(r is not None and r.injected_fault for r in records):
        return f"injected fault contained: {errors}"
    silent = [i for i, r in enumerate(records) if r is None]
    return (f"no rank reports an injected fault; ranks {silent} never reported (liveness "
            f"judges them), and the others only waited on them: {errors}")


def _waited_on_another(rec: StepRecord) -> bool:
    """Its error is a consequence: a peer's collective timed out, or torchrun ended it."""
    return rec.error is not None and rec.error.origin in (ErrorOrigin.TIMEOUT, ErrorOrigin.LOST)


def _reports_a_consequence(rec: StepRecord) -> bool:
    """vLLM's runner named a microbatch whose own error its thread recorded: on a peer no
    thread failed of its own accord (microbatch_crash judged them all first), so the one named,
    a sibling released after the peer's timeout included, failed only as a consequence."""
    report = (VLLM_RUNNER_REPORT.match(rec.error.message)
              if rec.error is not None and rec.error.kind == "RuntimeError" else None)
    if report is None or rec.vllm_exec is None:
        return False
    named = int(report.group(1))
    return any(ue.ubatch == named for ue in rec.vllm_exec.ubatch_errors)


def _silent_fault_timed_out(rec: StepRecord) -> bool:
    """Under vLLM's runner a microbatch that skips its MoE layer raises nothing: its only trace
    is a sibling's collective that its peer could not match, timed out. Contained when vLLM
    named that sibling and every thread error on the rank is such a wait, none a crash."""
    errors = rec.vllm_exec.ubatch_errors if rec.vllm_exec is not None else ()
    return (_reports_a_consequence(rec) and bool(errors)
            and all(e.error.origin in (ErrorOrigin.TIMEOUT, ErrorOrigin.LOST) for e in errors))


def _names_the_fault(err: StepError) -> bool:
    """The fault itself, a killed rank, or the failed microbatch it caused, named by its id
    (the harness's MicrobatchFailed, or vLLM's UBatchRunner.finish report raised from it)."""
    return (err.origin in (ErrorOrigin.INJECTED, ErrorOrigin.KILLED)
            and (err.kind in NAMED_FAULT_ERRORS
                 or (err.kind == "RuntimeError" and VLLM_RUNNER_REPORT.match(err.message)
                     is not None)))


def check_agreement(records: Sequence[StepRecord]) -> Judgement:
    """Every rank took the same decision (branch, graph, padding, split sizes, sync state)."""
    plans = [r.plan for r in records]
    if any(p is None for p in plans):
        return not_applicable("a rank failed before the DP sync returned")
    if len(plans) < 2:
        return not_applicable("one rank: no other rank's decision to compare with")
    disagreement = first_disagreement(plans)
    if disagreement is None:
        return held()
    return failed(disagreement.describe())


def check_fingerprints(records: Sequence[StepRecord]) -> Judgement:
    """Every rank issued the same collectives, in the same order, with the same sizes. A rank
    whose fingerprint is unknown (it died before reporting) is left out and named, never read
    as a rank that issued nothing."""
    if any(r.injected_fault for r in records):
        return not_applicable("a fault changes this step's collectives by design")
    known = [r for r in records if r.fingerprint is not None]
    unknown = [r.rank for r in records if r.fingerprint is None]
    note = f"ranks {unknown} left out: their collectives are unknown" if unknown else ""
    if len(known) < 2:
        return not_applicable(f"{len(known)} rank(s) with known collectives: nothing to "
                              f"compare{f' ({note})' if note else ''}")
    first, base = known[0], known[0].fingerprint
    for rec in known[1:]:
        if rec.fingerprint == base:
            continue
        for i in range(max(len(base), len(rec.fingerprint))):
            a = base[i] if i < len(base) else None
            b = rec.fingerprint[i] if i < len(rec.fingerprint) else None
            if a != b:
                return failed(f"collective #{i}: rank {first.rank} issues {a}, "
                             f"rank {rec.rank} issues {b}" + (f" ({note})" if note else ""))
    return held(note)


def check_replay_split(records: Sequence[StepRecord]) -> Judgement:
    """A replayed microbatched graph splits the batch as it was split at capture."""
    if not any(rec.executed == "replay" for rec in records):
        return not_applicable("no rank replayed a graph")
    for rec in records:
        if rec.executed != "replay" or rec.captured_split == rec.replay_split:
            continue
        for i, (cap, rep) in enumerate(zip(rec.captured_split, rec.replay_split, strict=True)):
            if cap != rep:
                return failed(f"rank {rec.rank} microbatch {i}: captured requests "
                             f"[{cap[0]}:{cap[1]}] tokens [{cap[2]}:{cap[3]}], replay prepared "
                             f"requests [{rep[0]}:{rep[1]}] tokens [{rep[2]}:{rep[3]}]")
    return held()


def check_no_empty_region(records: Sequence[StepRecord]) -> Judgement:
    """A FULL microbatched replay needs a real token in every region of every busy rank, judged
    on the token bounds the replay ran (its graph's split), not on a formula of G."""
    # An idle rank's dummy batch is padding in every region, laid out as at capture: with
    # drafts its q dummy tokens can meet the guard on a twin of fewer than 2q (§1.6, §8).
    replays = [r for r in records if r.plan is not None and r.plan.kind == "full-microbatched"
               and r.plan.real_tokens > 0]
    if not replays:
        return not_applicable("no rank with real tokens replays a microbatched graph")
    for rec in replays:
        empty = empty_regions_run(rec)
        if empty:
            return failed(f"rank {rec.rank} ({rec.plan.real_tokens} real tokens) replays "
                         f"{rec.plan.desc.label()} with no real token in region(s) {empty}"
                         f"{_bounds_note(rec)}")
    return held()


def empty_regions_run(rec: StepRecord) -> list[int]:
    """Regions without a real token: of the split the replay ran, or (a staged replay, whose
    real tokens were moved, or a rank that never got to run) of the plan."""
    staged = rec.plan.state is not None and rec.plan.state.staged_tokens is not None
    if rec.executed != "replay" or staged or not rec.ran_split:
        return list(rec.plan.empty_regions())
    real = rec.plan.real_tokens
    return [i for i, (_, _, start, _) in enumerate(rec.ran_split) if real <= start]


def _bounds_note(rec: StepRecord) -> str:
    if rec.executed != "replay" or not rec.ran_split:
        return ""
    return f" (token bounds run: {[(s[2], s[3]) for s in rec.ran_split]})"


def _first_difference(got: Rows, want: Rows) -> int | None:
    """The first row index where `got` and `want` differ (or where one runs out)."""
    if got == want:  # equal floats are within any tolerance (a NaN never equals itself)
        return None
    bad = mismatched_rows(rows_tensor(got), rows_tensor(want), TOLERANCE)
    if bad:
        return bad[0]
    return None if len(got) == len(want) else min(len(got), len(want))


def check_reference(records: Sequence[StepRecord], reference: ReferenceRows) -> Judgement:
    """Real rows and per-request state equal the single-process reference (padding never
    leaks into them)."""
    if any(r.error is not None or r.injected_fault for r in records):
        return not_applicable("the step failed or had a fault injected")
    for rec in records:
        row = _first_difference(rec.outputs, reference.outputs[rec.rank])
        if row is not None:
            return failed(f"rank {rec.rank} output row {row} (of "
                         f"{len(reference.outputs[rec.rank])} real) differs from the reference")
        real_slots = len(reference.states[rec.rank]) - 1  # the last slot is scratch
        slot = _first_difference(rec.state[:real_slots], reference.states[rec.rank][:real_slots])
        if slot is not None:
            return failed(f"rank {rec.rank} state of request slot {slot} differs from the "
                         "reference")
    return held()


def check_routing(records: Sequence[StepRecord], reference: ReferenceRows) -> Judgement:
    """Every rank received exactly the rows the reference routes to its experts: no row lost,
    duplicated, misrouted, and no padding row dispatched."""
    if any(r.error is not None or r.injected_fault for r in records):
        return not_applicable("the step failed or had a fault injected")
    for rec in records:
        want = reference.routes[rec.rank]
        if rec.routes == want:
            continue
        extra = sorted(set(rec.routes) - set(want))
        missing = sorted(set(want) - set(rec.routes))
        what = (f"received {extra[0]} (source rank, token, expert) it should not" if extra
                else f"never received {missing[0]}" if missing
                else "received a row twice")
        return failed(f"rank {rec.rank} {what}")
    return held()


def check_thread_hygiene(records: Sequence[StepRecord]) -> Judgement:
    """After a step no microbatch thread is alive and no run is left pending."""
    for rec in records:
        if rec.threads_alive:
            return failed(f"rank {rec.rank}: threads {list(rec.threads_alive)} still alive")
        if rec.pending_run:
            return failed(f"rank {rec.rank}: a microbatched run is still pending")
    return held()


def _decision_fields(plan: StepPlan) -> dict[str, object]:
    # The DP state's request count is left out: vLLM 0.33.0 reports the most real requests
    # on any rank where the harness reports the graph's, by definition on both sides.
    return {"decision": plan.kind, "graph": plan.desc.label(), "padded_tokens": plan.num_tokens,
            "regions (real/size)": " ".join(f"{r.real_tokens}/{r.tokens}" for r in plan.regions),
            "tokens_across_dp": plan.state.num_tokens_across_dp if plan.state else None,
            "skip_drafts": plan.state.skip_drafts if plan.state else None}


def check_differential(records: Sequence[StepRecord],
                       reference: Sequence[StepPlan]) -> Judgement:
    """The system under test decided, field by field, what the harness's reference does."""
    if not any(r.plan is not None for r in records):
        return not_applicable(NO_PLAN)
    for rec, expected in zip(records, reference, strict=True):
        if rec.plan is None:
            continue
        got, want = _decision_fields(rec.plan), _decision_fields(expected)
        wrong = [f"{field}: {got[field]} (reference: {want[field]})"
                 for field in got if got[field] != want[field]]
        if wrong:
            return failed(f"rank {rec.rank}: " + "; ".join(wrong))
    return held()


def check_differential_base(records: Sequence[StepRecord], base: Sequence[StepPlan],
                            reference: Sequence[StepPlan]) -> Judgement:
    """A patched vLLM changed no decision the unpatched one got right: where the base vLLM
    agrees with the harness's reference, the patched one must decide the same, field by
    field. Changes where the base was wrong are what a fix is for, and pass here."""
    if not any(r.plan is not None for r in records):
        return not_applicable(NO_PLAN)
    changed = 0
    for rec, was, want in zip(records, base, reference, strict=True):
        if rec.plan is None:
            continue
        got, before, ref = (_decision_fields(p) for p in (rec.plan, was, want))
        for field in got:
            if got[field] == before[field]:
                continue
            if before[field] == ref[field]:
                return failed(f"rank {rec.rank}: {field}: {got[field]} (base vllm: "
                             f"{before[field]}, reference: {ref[field]}): a decision the "
                             "unpatched vLLM got right")
            changed += 1
    return held(f"{changed} field(s) changed where the base vllm was wrong"
               if changed else "")


def _spec_fields(plan: StepPlan) -> list[tuple[str, object]]:
    # Every field the spec fixes for a rank's plan, in the order §1.3 and §2.4 settle them.
    desc, state = plan.desc, plan.state
    return [("cg_mode", desc.cg_mode.name), ("graph num_tokens", desc.num_tokens),
            ("graph num_reqs", desc.num_reqs), ("graph uct", desc.uniform_token_count),
            ("graph max_query_len", desc.max_query_len), ("num_ubatches", desc.num_ubatches),
            ("dp_sync", "none" if state is None else "set"),
            ("tokens_across_dp", state and state.num_tokens_across_dp),
            ("synced uct", state and state.uniform_token_count),
            ("sync eager", state and state.eager), ("sync num_reqs", state and state.num_reqs),
            ("skip_drafts", state and state.skip_drafts),
            ("staged_tokens", state and state.staged_tokens),
            ("padded_tokens", plan.num_tokens), ("padded_reqs", plan.num_reqs),
            ("real_tokens", plan.real_tokens),
            ("regions (real/size)", " ".join(f"{r.real_tokens}/{r.tokens}"
                                             for r in plan.regions))]


def check_spec_decision(records: Sequence[StepRecord],
                        expected: Sequence[StepPlan]) -> Judgement:
    """The harness decided, field by field, what docs/spec.md says for its own config
    (harness/spec/decision.py, which shares no code with the decision code)."""
    if not any(r.plan is not None for r in records):
        return not_applicable(NO_PLAN)
    for rec, want_plan in zip(records, expected, strict=True):
        if rec.plan is None:
            continue
        for (field, got), (_, want) in zip(_spec_fields(rec.plan), _spec_fields(want_plan),
                                           strict=True):
            if got != want:
                return failed(f"rank {rec.rank}: {field}: {got} (spec: {want})")
    return held()
