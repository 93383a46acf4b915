"""batches_df reads request-level batches back from a trace, with idle/busy formation."""

import math

import pytest

from batchlab.analysis.batches import BATCH_COLUMNS, batches_df, delivered_at_batch_end
from batchlab.sim import SimBackend
from batchlab.steptime.cost_model import CostModel
from batchlab.engine import Engine
from batchlab.schedulers import ContinuousBatcher, DynamicBatcher, StaticBatcher
from batchlab.trace import Trace
from batchlab.workloads.scripted import scripted_workload


def steps_of(seconds):
    """Every step takes exactly ``seconds``."""
    return SimBackend(CostModel(seconds, 0.0, 0.0, 0.0), kv_capacity_tokens=4096)


def test_dynamic_scene_batches_by_hand():
    # max 4, timeout 0.3 s, 5 steps of 0.1 s per batch. By hand: the timer sends the first three
    # off at 0.3 s; the rush fills a batch at 1.06 s; its fifth member waits for the server (1.56 s);
    # the last request comes to an idle server and leaves by its timer at 2.8 s.
    arrivals = [0.0, 0.1, 0.15, 1.0, 1.02, 1.04, 1.06, 1.08, 2.5]
    trace = Engine(DynamicBatcher(4, 0.3), steps_of(0.1)).run(
        scripted_workload(arrivals, max_new_tokens=5))
    df = batches_df(trace)
    assert list(df.columns) == BATCH_COLUMNS
    assert df["size"].tolist() == [3, 4, 1, 1]
    assert df["request_ids"].tolist()[2] == ("r007",)
    assert df["start"].tolist() == pytest.approx([0.3, 1.06, 1.56, 2.8])
    assert df["end"].tolist() == pytest.approx([0.8, 1.56, 2.06, 3.3])
    assert df["formed_while"].tolist() == ["idle", "idle", "busy", "idle"]
    assert df["max_wait"].tolist() == pytest.approx([0.3, 0.06, 0.48, 0.3])
    assert math.isnan(df["previous_end"].iloc[0])
    assert df["previous_end"].tolist()[1:] == pytest.approx([0.8, 1.56, 2.06])
    assert df["num_steps"].tolist() == [5, 5, 5, 5]
    assert df["request_ids"].tolist()[0][0] == "r000"


def test_static_batch_lengths_and_steps():
    reqs = scripted_workload([0.0] * 6, max_new_tokens=[4, 4, 4, 4, 4, 48])
    df = batches_df(Engine(StaticBatcher(6), steps_of(0.05)).run(reqs))
    assert len(df) == 1
    row = df.iloc[0]
    assert (row["size"], row["shortest_output"], row["longest_output"], row["num_steps"]) == (6, 4, 48, 48)
    assert row["formed_while"] == "idle" and row["max_wait"] == 0.0


def test_continuous_batching_has_no_batches():
    reqs = scripted_workload([0.0, 0.0], max_new_tokens=3)
    trace = Engine(ContinuousBatcher(max_num_seqs=4, max_num_batched_tokens=64), steps_of(0.01)).run(reqs)
    assert batches_df(trace).empty
    assert batches_df(Trace()).empty


def test_not_a_trace_is_refused():
    with pytest.raises(ValueError, match=r"trace=\[1, 2, 3\]; must be a batchlab Trace"):
        batches_df([1, 2, 3])


@pytest.mark.parametrize("make", [lambda stream: StaticBatcher(3, stream=stream),
                                  lambda stream: DynamicBatcher(4, 0.3, stream=stream)])
def test_a_streamed_run_delivered_at_batch_end_is_the_non_streaming_run(make):
    # Mixed lengths, so members finish before their batch ends; arrivals during a batch queue.
    arrivals = [0.0, 0.05, 0.1, 0.2, 0.7, 0.75, 0.8, 1.9]
    reqs = lambda: scripted_workload(arrivals, max_new_tokens=[2, 9, 5, 3, 7, 1, 4, 6])
    streamed = Engine(make(True), steps_of(0.1)).run(reqs())
    real = Engine(make(False), steps_of(0.1)).run(reqs())
    derived = delivered_at_batch_end(streamed)
    assert [s.start for s in streamed.steps] == [s.start for s in real.steps]   # same schedule
    for got, want in zip(derived.requests, real.requests):
        assert (got.request_id, got.streamed) == (want.request_id, False)
        assert got.release_time == pytest.approx(want.release_time)
        assert got.visible_token_times == pytest.approx(want.visible_token_times)
    # Streaming showed the short answers sooner; at batch end they all arrive together.
    early = [s.release_time < d.release_time for s, d in zip(streamed.requests, derived.requests)]
    assert any(early) and all(s.release_time <= d.release_time
                              for s, d in zip(streamed.requests, derived.requests))


def test_delivery_at_batch_end_needs_request_level_batches():
    reqs = scripted_workload([0.0, 0.0], max_new_tokens=3)
    trace = Engine(ContinuousBatcher(max_num_seqs=4, max_num_batched_tokens=64), steps_of(0.01)).run(reqs)
    with pytest.raises(ValueError, match="no request-level batches"):
        delivered_at_batch_end(trace)
