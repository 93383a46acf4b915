"""Checkers for notebook 11 (which latency are you feeling?): diagnose four capstone traces.

Each exercise gives one trace of ``data/capstone/`` (served by a configuration the reader is not
told) and asks for a diagnosis as a dict::

    {"slow": "ttft" | "itl",     # which latency users feel: a late first token (queueing and
                                 # prefill) or a slow stream after it (decode throughput)
     "knob": one of KNOBS}       # the one change that would help most

The true answers are sealed below (base64 of a JSON object, decoded only when checking, so a
glance at this file does not spoil the exercise). They were confirmed by turning every knob on
each configuration and serving the same workload again (tests/test_capstone.py, using
scripts/make_capstone_traces.py): a free knob (anything but ``more_capacity``) is the answer when
it helps; ``more_capacity`` only when no free knob does.
"""

from __future__ import annotations

import base64
import json

from batchlab.exercises import Verdict, exercise

SLOW = ("ttft", "itl")
KNOBS: dict[str, str] = {
    "more_max_num_seqs": "let more sequences run at once (raise max_num_seqs)",
    "chunked_prefill": "chunked prefill with a modest per-step token budget",
    "more_capacity": "more capacity or less load (a faster device, more replicas)",
    "shorter_timeout": "a shorter timer on a dynamic batcher",
}
EXERCISE_TRACES = {"11.1": "trace_a", "11.2": "trace_b", "11.3": "trace_c", "11.4": "trace_d"}

_SEALED_KEY = ("eyJ0cmFjZV9hIjogWyJpdGwiLCAiY2h1bmtlZF9wcmVmaWxsIl0sICJ0cmFjZV9iIjogWyJ0dGZ0Iiwg"
               "Im1vcmVfbWF4X251bV9zZXFzIl0sICJ0cmFjZV9jIjogWyJ0dGZ0IiwgInNob3J0ZXJfdGltZW91dCJd"
               "LCAidHJhY2VfZCI6IFsiaXRsIiwgIm1vcmVfY2FwYWNpdHkiXX0=")

# What each configuration was, shown once the reader's diagnosis is right.
_REVEAL = {
    "trace_a": "continuous batching without chunked prefill: every long prompt (400-800 tokens) "
               "was computed in one step, and every stream froze for that step.",
    "trace_b": "continuous batching with max_num_seqs=4: a queue grew while each step carried only "
               "four sequences and cost little more than a step for one.",
    "trace_c": "a dynamic batcher with a 2 s timer under light traffic: most requests waited for "
               "the timer while the device sat idle.",
    "trace_d": "continuous batching of long answers (200-400 tokens) near the device's limit: "
               "every step carried dozens of sequences, so every stream was slow; no setting "
               "fixes that.",
}


def answer_key() -> dict[str, tuple[str, str]]:
    """The sealed answers: trace name -> (slow, knob). Reading this spoils the exercises."""
    data = json.loads(base64.b64decode(_SEALED_KEY).decode("utf-8"))
    return {name: (slow, knob) for name, (slow, knob) in data.items()}


def check_diagnosis(trace_name: str, answer) -> Verdict:
    """Compare a diagnosis dict with the sealed answer for ``trace_name``."""
    if answer is None or answer is ...:
        return Verdict("not attempted",
                       'set answer = {"slow": ..., "knob": ...} and run the cell again')
    if not isinstance(answer, dict) or set(answer) != {"slow", "knob"}:
        return Verdict("wrong", 'give a dict with exactly two keys, e.g. {"slow": "ttft", '
                                '"knob": "more_capacity"}')
    slow, knob = answer["slow"], answer["knob"]
    if slow not in SLOW:
        return Verdict("wrong", f"slow={slow!r}; choose one of {list(SLOW)}")
    if knob not in KNOBS:
        return Verdict("wrong", f"knob={knob!r}; choose one of {list(KNOBS)}")
    true_slow, true_knob = answer_key()[trace_name]
    if slow == true_slow and knob == true_knob:
        return Verdict("correct", f"{trace_name} was {_REVEAL[trace_name]}")
    if slow != true_slow:
        return Verdict("wrong",
                       "look again at where the extra waiting goes: compare each request's "
                                "TTFT and its stream (E2E - TTFT) with what it would take alone")
    if true_knob != "more_capacity" and knob == "more_capacity":
        return Verdict("wrong", f"{slow!r} is right, and more capacity would help, but a free "
                                "setting fixes this trace: which rule of the server "
                                "makes people wait?")
    return Verdict("wrong",
                   f"{slow!r} is right, the knob is not: what do the steps look like while "
                            "the latency is bad (their size, their prefill tokens, idle gaps)?")


@exercise("11.1")
def check_trace_a(answer) -> Verdict:
    """Diagnosis of data/capstone/trace_a.json."""
    return check_diagnosis("trace_a", answer)


@exercise("11.2")
def check_trace_b(answer) -> Verdict:
    """Diagnosis of data/capstone/trace_b.json."""
    return check_diagnosis("trace_b", answer)


@exercise("11.3")
def check_trace_c(answer) -> Verdict:
    """Diagnosis of data/capstone/trace_c.json."""
    return check_diagnosis("trace_c", answer)


@exercise("11.4")
def check_trace_d(answer) -> Verdict:
    """Diagnosis of data/capstone/trace_d.json."""
    return check_diagnosis("trace_d", answer)
