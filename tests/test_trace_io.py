"""Saving and loading traces (batchlab.analysis.trace_io): a loaded trace measures like the original."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from batchlab.analysis import metrics
from batchlab.analysis.trace_io import load_trace, save_trace, trace_from_dict, trace_to_dict
from batchlab.sim import SimBackend
from batchlab.steptime.cost_model import CostModel
from batchlab.engine import Engine
from batchlab.requests import FinishReason, RequestStatus
from batchlab.schedulers import ContinuousBatcher, DynamicBatcher, StaticBatcher
from batchlab.speculative import AcceptanceModel, SpeculativeConfig
from batchlab.trace import RequestRecord, Trace
from batchlab.workloads import make_workload

SPEC = SpeculativeConfig(3, method="ngram")
COST = CostModel(fixed_s=0.02, per_seq_s=0.001, per_token_s=0.0003, per_attention_pair_s=1e-8)


def _serve(scheduler, requests, kv=1 << 15, noise=0.05):
    return Engine(scheduler, SimBackend(COST, kv_capacity_tokens=kv, noise=noise, seed=3)).run(requests)


def _traces() -> dict[str, Trace]:
    chat = make_workload(40, "chat", scale="full", arrival="poisson", rate=5.0, seed=7)
    long_prompts = make_workload(20, prompt_len=700, output_len=12, arrival="poisson", rate=2.0,
                                 seed=8, id_prefix="p")
    mixed = sorted(chat + long_prompts, key=lambda r: r.arrival_time)
    # A request too long for the small cache is rejected, and must survive the round trip.
    too_long = make_workload(1, prompt_len=3000, output_len=8, arrival="at_once", id_prefix="x")
    with_rejected = sorted(chat[:10] + too_long, key=lambda r: r.arrival_time)
    return {
        "chunked": _serve(ContinuousBatcher(max_num_seqs=8, max_num_batched_tokens=256), mixed),
        "unchunked": _serve(ContinuousBatcher(max_num_seqs=8, max_num_batched_tokens=2048,
                                              chunked_prefill=False), mixed),
        "dynamic_non_streaming": _serve(DynamicBatcher(max_batch_size=6, timeout=0.3), chat),
        "static_streaming": _serve(StaticBatcher(4, stream=True), chat[:20]),
        "rejected": _serve(ContinuousBatcher(max_num_seqs=4), with_rejected, kv=2048),
        "speculative": Engine(ContinuousBatcher(max_num_seqs=8, max_num_batched_tokens=256), SimBackend(
            COST, kv_capacity_tokens=1 << 15, noise=0.05, seed=3, speculative_config=SPEC,
            acceptance=AcceptanceModel(0.6, draft_rate=0.7))).run(mixed),
    }


TRACES = _traces()


def _steps_as_sets(trace: Trace) -> list[tuple]:
    """Each step's timing and its chunks as a set (a loaded step lists decodes first)."""
    return [(round(s.start, 6), round(s.end, 6), s.held_slots, s.batch_id,
             frozenset((c.request_id, c.start, c.num_tokens, c.samples) for c in s.chunks))
            for s in trace.steps]


@pytest.mark.parametrize("name", sorted(TRACES))
def test_round_trip_keeps_every_request_and_step(name, tmp_path):
    trace = TRACES[name]
    loaded = load_trace(save_trace(trace, tmp_path / "t.json"))
    assert _steps_as_sets(loaded) == _steps_as_sets(trace)
    assert len(loaded.requests) == len(trace.requests)
    for a, b in zip(trace.requests, loaded.requests):
        assert (a.request_id, a.prompt_len, a.max_new_tokens, a.status, a.finish_reason, a.streamed) == \
               (b.request_id, b.prompt_len, b.max_new_tokens, b.status, b.finish_reason, b.streamed)
        assert np.allclose(a.token_times, b.token_times, atol=1e-6, rtol=0)
        assert a.output_ids == b.output_ids
        assert a.spec_checks == b.spec_checks
        for x, y in ((a.arrival_time, b.arrival_time), (a.release_time, b.release_time),
                     (a.first_scheduled_time, b.first_scheduled_time)):
            assert (x is None and y is None) or abs(x - y) <= 1e-6


@pytest.mark.parametrize("name", sorted(TRACES))
def test_loaded_trace_measures_the_same(name, tmp_path):
    trace = TRACES[name]
    loaded = load_trace(save_trace(trace, tmp_path / "t.json"))
    diff = (metrics.summarize(loaded) - metrics.summarize(trace)).abs().to_numpy()
    assert np.nanmax(diff) < 1e-5
    assert metrics.request_counts(loaded) == metrics.request_counts(trace)


def test_rejected_request_keeps_its_reason(tmp_path):
    loaded = load_trace(save_trace(TRACES["rejected"], tmp_path / "t.json"))
    rejected = [r for r in loaded.requests if r.status == RequestStatus.REJECTED]
    assert len(rejected) == 1 and rejected[0].finish_reason == "rejected" and "KV tokens" in rejected[0].finish_detail
    assert rejected[0].token_times == [] and rejected[0].release_time is not None


def test_a_trace_saved_in_the_older_one_string_form_still_loads(tmp_path):
    path = save_trace(TRACES["rejected"], tmp_path / "t.json")
    data = json.loads(path.read_text())
    reqs = data["requests"]
    reqs["finish_reason"] = [f"{r}: {d}" if d else r for r, d in zip(reqs["finish_reason"], reqs["finish_detail"])]
    del reqs["finish_detail"]
    path.write_text(json.dumps(data))
    loaded = load_trace(path)
    rejected = [r for r in loaded.requests if r.status == RequestStatus.REJECTED][0]
    assert rejected.finish_reason is FinishReason.REJECTED and "KV tokens" in rejected.finish_detail
    data["requests"]["finish_reason"][0] = "exploded"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="finish_reason='exploded'; must be one of"):
        load_trace(path)


def test_saving_is_deterministic_and_meta_can_be_replaced(tmp_path):
    trace = TRACES["chunked"]
    a = save_trace(trace, tmp_path / "a.json", meta={"name": "x"}).read_bytes()
    b = save_trace(trace, tmp_path / "b.json", meta={"name": "x"}).read_bytes()
    assert a == b
    assert json.loads(a)["meta"] == {"name": "x"}
    assert load_trace(tmp_path / "a.json").meta == {"name": "x"}


def test_steady_decode_steps_are_stored_compactly():
    data = trace_to_dict(TRACES["chunked"])
    decodes = data["steps"]["decodes"]
    assert sum(d is None for d in decodes) > 0.8 * len(decodes)
    assert "token_gaps" not in data["requests"], "token times should be replayed from the steps"


def test_trace_without_steps_stores_its_token_times():
    record = RequestRecord("a", 0.5, 4, 3, RequestStatus.FINISHED, "length", 0.6,
                           [0.7, 0.9, 1.25], 1.25, True, [5, 6, 7])
    trace = Trace(requests=[record], steps=[], meta={})
    data = trace_to_dict(trace)
    assert data["requests"]["token_gaps"] == [[200000, 200000, 350000]]
    assert data["requests"]["output_ids"] == [[5, 6, 7]]
    loaded = trace_from_dict(json.loads(json.dumps(data)))
    assert loaded.requests[0].token_times == [0.7, 0.9, 1.25]
    assert loaded.requests[0].output_ids == [5, 6, 7]


def test_checked_drafts_are_stored_as_version_2_and_checked_on_load():
    data = trace_to_dict(TRACES["speculative"])
    assert data["version"] == 2 and "token_gaps" not in data["requests"]     # token times replay from checks
    assert trace_to_dict(TRACES["chunked"])["version"] == 1                     # no drafts: the older format
    first = next(i for i, c in enumerate(data["steps"]["checks"]) if c)
    for bad in ([0, 3, 4], [0, 0, 0], data["steps"]["checks"][first][:2]):
        broken = json.loads(json.dumps(data))
        broken["steps"]["checks"][first] = bad
        with pytest.raises(ValueError, match=f"step {first}: check|step {first}: checks="):
            trace_from_dict(broken)
    with pytest.raises(ValueError, match="missing column 'checks'"):
        trace_from_dict({**data, "steps": {k: v for k, v in data["steps"].items() if k != "checks"}})


def test_bad_files_are_rejected_with_a_reason(tmp_path):
    data = trace_to_dict(TRACES["chunked"])
    with pytest.raises(ValueError, match="not a batchlab-trace"):
        trace_from_dict({**data, "format": "something"})
    with pytest.raises(ValueError, match="version"):
        trace_from_dict({**data, "version": 99})
    broken = json.loads(json.dumps(data))
    broken["steps"]["prefills"][0] = [10_000, 5]
    with pytest.raises(ValueError, match="request index"):
        trace_from_dict(broken)
    broken = json.loads(json.dumps(data))
    broken["steps"]["prefills"][0] = [broken["steps"]["prefills"][0][0], 100_000]
    with pytest.raises(ValueError, match="known tokens"):
        trace_from_dict(broken)
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_trace(path)
    with pytest.raises(ValueError, match=r"trace=.*; must be a batchlab Trace \(got DataFrame\)"):
        trace_to_dict(pd.DataFrame())
