"""Worked solutions for notebook 11 (which latency are you feeling?).

``diagnose`` writes the notebook's reasoning down as rules, and each exercise applies it to its
trace. Nothing here knows the configurations; everything is read from the trace and the cost
model stored next to it.
"""

from pathlib import Path

import numpy as np

from batchlab.analysis import metrics
from batchlab.analysis.diagnosis import (
    excess_share_before_first_token,
    idle_while_waiting,
    steps_with_waiting,
    token_gaps,
)
from batchlab.analysis.trace_io import load_trace
from batchlab.steptime.cost_model import CostModel

CAPSTONE = Path(__file__).resolve().parent.parent / "data" / "capstone"


def diagnose(trace, cost: CostModel) -> dict:
    """Which latency users feel, and the one knob that would help most.

    1. Slow part: compare every request with itself alone on an empty server. If most of the
       extra waiting comes before the first token, users feel a late first token ("ttft");
       otherwise a slow stream ("itl").
    2. A late first token comes from waiting. If the device was idle while requests waited, a
       rule held them back: a batching timer ("shorter_timeout"). If it was busy, look at the
       batch while people waited: pinned at one size, with the cost model saying a step twice
       as large would serve clearly more, means a setting caps it ("more_max_num_seqs");
       otherwise the device is full ("more_capacity").
    3. A slow stream is either spiky or uniformly slow. If the long gaps (over 3x the median)
       are a visible share and nearly all come from steps that computed prompt tokens, prompts
       stall the streams ("chunked_prefill"); otherwise every step is just slow
       ("more_capacity").
    """
    if excess_share_before_first_token(trace, cost) > 0.5:
        waited = metrics.per_request_metrics(trace)["queue_time"].sum()
        if waited > 0 and idle_while_waiting(trace) > 0.2 * waited:
            return {"slow": "ttft", "knob": "shorter_timeout"}
        steps = steps_with_waiting(trace)
        sizes = steps.loc[steps["num_waiting"] > 0, "num_seqs"]
        pinned = (sizes == sizes.max()).mean() > 0.8
        batch = int(sizes.median())
        # Decode tokens per second at this batch size and at twice it, from the cost model.
        rate = lambda b: b / cost.predict_features(b, b, b * 100)  # noqa: E731 (context ~100)
        gain = rate(2 * batch) / rate(batch)
        knob = "more_max_num_seqs" if pinned and gain > 1.25 else "more_capacity"
        return {"slow": "ttft", "knob": knob}
    gaps = token_gaps(trace)
    long = gaps[gaps["gap"] > 3 * gaps["gap"].median()]
    if len(long) > 0.005 * len(gaps) and np.mean(long["step_prefill_tokens"] > 0) > 0.8:
        return {"slow": "itl", "knob": "chunked_prefill"}
    return {"slow": "itl", "knob": "more_capacity"}


def solve(name: str) -> dict:
    return diagnose(load_trace(CAPSTONE / f"{name}.json"), CostModel.load(CAPSTONE / "cost_model.json"))


SOLUTIONS = {
    "11.1": lambda: solve("trace_a"),
    "11.2": lambda: solve("trace_b"),
    "11.3": lambda: solve("trace_c"),
    "11.4": lambda: solve("trace_d"),
}
WRONG = {
    "11.1": {"slow": "ttft", "knob": "chunked_prefill"},     # prompts stall streams, not first tokens
    "11.2": {"slow": "ttft", "knob": "more_capacity"},       # the device had room to spare
    "11.3": {"slow": "ttft", "knob": "more_max_num_seqs"},   # batches were small because of the timer
    "11.4": {"slow": "itl", "knob": "chunked_prefill"},      # no prompt is long enough to stall
}
