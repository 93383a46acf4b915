"""batchlab.analysis.diagnosis: the lone-request yardstick, excess waiting, and gaps blamed on steps."""

from __future__ import annotations

import numpy as np
import pytest

from batchlab.analysis.diagnosis import (
    excess_latency,
    excess_share_before_first_token,
    idle_while_waiting,
    lone_decode_time,
    lone_ttft,
    num_waiting_at,
    steps_with_waiting,
    token_gaps,
)
from batchlab.sim import SimBackend
from batchlab.steptime.cost_model import CostModel
from batchlab.engine import Engine
from batchlab.requests import Request
from batchlab.schedulers import ContinuousBatcher, DynamicBatcher

COST = CostModel(fixed_s=0.03, per_seq_s=0.002, per_token_s=0.0005, per_attention_pair_s=1e-7)


def _req(rid, prompt_len, out, arrival):
    return Request(rid, None, out, arrival, prompt_len=prompt_len)


def _serve(scheduler, requests):
    return Engine(scheduler, SimBackend(COST, kv_capacity_tokens=1 << 15)).run(requests)


@pytest.mark.parametrize("prompt_len,out", [(1, 1), (7, 2), (300, 40)])
def test_lone_yardstick_is_a_request_alone_on_the_simulator(prompt_len, out):
    trace = _serve(ContinuousBatcher(max_num_seqs=4, max_num_batched_tokens=4096),
                   [_req("a", prompt_len, out, 0.0)])
    times = trace.requests[0].token_times
    assert times[0] == pytest.approx(lone_ttft(COST, prompt_len), rel=1e-12)
    assert times[-1] - times[0] == pytest.approx(lone_decode_time(COST, prompt_len, out), rel=1e-12,
                                                 abs=1e-15)
    ex = excess_latency(trace, COST)
    assert abs(ex.loc[0, "ttft_excess"]) < 1e-12 and abs(ex.loc[0, "stream_excess"]) < 1e-12


def test_queueing_shows_up_before_the_first_token():
    # One slot: the second request waits for the first to finish.
    trace = _serve(ContinuousBatcher(max_num_seqs=1), [_req("a", 16, 50, 0.0), _req("b", 16, 5, 0.0)])
    ex = excess_latency(trace, COST).set_index("request_id")
    assert ex.loc["b", "ttft_excess"] > 1.0 and abs(ex.loc["b", "stream_excess"]) < 1e-9
    assert excess_share_before_first_token(trace, COST) > 0.99


def test_sharing_steps_shows_up_in_the_stream():
    # Eight long streams together: every decode step is slower than alone, nobody queues.
    trace = _serve(ContinuousBatcher(max_num_seqs=8),
                   [_req(f"r{i}", 8, 200, 0.0) for i in range(8)])
    ex = excess_latency(trace, COST)
    assert (ex["stream_excess"] > 0.5).all()
    assert excess_share_before_first_token(trace, COST) < 0.1


def test_a_long_gap_is_blamed_on_the_prefill_step_that_caused_it():
    # A stream decodes alone; a 1,500-token prompt arrives and is computed in one step.
    trace = _serve(ContinuousBatcher(max_num_seqs=4, max_num_batched_tokens=4096, chunked_prefill=False),
                   [_req("stream", 8, 60, 0.0), _req("doc", 1500, 2, 0.5)])
    gaps = token_gaps(trace)
    stream = gaps[gaps["request_id"] == "stream"]
    assert len(stream) == 59 and stream["step"].notna().all()
    worst = stream.loc[stream["gap"].idxmax()]
    assert worst["step_prefill_tokens"] == 1500
    assert worst["gap"] == pytest.approx(worst["step_duration"])
    assert (stream.loc[stream["step_prefill_tokens"] == 0, "gap"] < worst["gap"] / 5).all()


def test_waiting_counts_and_idle_time_under_a_timer():
    # A dynamic batcher with a 1 s timer: the lone first request waits 1 s on an idle device.
    trace = _serve(DynamicBatcher(max_batch_size=8, timeout=1.0, stream=True),
                   [_req("a", 16, 4, 0.0), _req("b", 16, 4, 0.4), _req("c", 16, 4, 5.0)])
    assert idle_while_waiting(trace) == pytest.approx(2.0)   # 1 s for a (b joins), 1 s for c
    assert list(num_waiting_at(trace, np.array([0.2, 0.5, 1.5, 5.5]))) == [1, 2, 0, 1]
    steps = steps_with_waiting(trace)
    assert (steps["num_waiting"] == 0).all()   # a batch leaves with everyone waiting


def test_continuous_batching_never_idles_while_someone_waits():
    trace = _serve(ContinuousBatcher(max_num_seqs=2),
                   [_req(f"r{i}", 32, 20, 0.1 * i) for i in range(6)])
    assert idle_while_waiting(trace) == pytest.approx(0.0, abs=1e-12)
    steps = steps_with_waiting(trace)
    assert (steps["num_waiting"] > 0).any() and (steps.loc[steps["num_waiting"] > 0, "num_seqs"] == 2).all()


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="cost='not a cost model'; must be a batchlab CostModel"):
        lone_ttft("not a cost model", 5)
    with pytest.raises(ValueError, match="prompt_len=0; must be an int >= 1"):
        lone_ttft(COST, 0)
    with pytest.raises(ValueError, match="num_output_tokens=0; must be an int >= 1"):
        lone_decode_time(COST, 5, 0)
