"""The capstone traces (data/capstone/): reproducible, small, unlabelled, and correctly keyed.

The answer key of notebook 11 lives in batchlab/exercises/nb11.py. Here it is confirmed the hard
way: every knob is turned on each configuration of scripts/make_capstone_traces.py and the same
workload is served again. The keyed knob must be the one that helps (a free setting whenever one
helps, more capacity only when none does), and the keyed latency must be where the excess
waiting goes.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from batchlab.analysis import metrics
from batchlab.analysis.diagnosis import excess_share_before_first_token
from batchlab.analysis.trace_io import load_trace
from batchlab.steptime.cost_model import CostModel
from batchlab.exercises import nb11

ROOT = Path(__file__).resolve().parent.parent
CAPSTONE = ROOT / "data" / "capstone"
EXAMPLE_KEY = ("ttft", "more_capacity")   # notebook 11 walks through this one in the open
FREE_KNOBS = ("more_max_num_seqs", "chunked_prefill", "shorter_timeout")


def _script():
    name = "make_capstone_traces"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "make_capstone_traces.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module          # dataclasses look their module up while defining
        spec.loader.exec_module(module)
    return sys.modules[name]


@lru_cache(maxsize=1)
def _cost() -> CostModel:
    return CostModel.load(CAPSTONE / "cost_model.json")


def _keys() -> dict[str, tuple[str, str]]:
    return {**nb11.answer_key(), "example": EXAMPLE_KEY}


def test_files_are_what_the_script_makes(tmp_path):
    script = _script()
    written = script.write_traces(out_dir=tmp_path, cost_dir=CAPSTONE)
    assert sorted(p.name for p in written) == sorted(f"{c.name}.json" for c in script.CONFIGS)
    for path in written:
        stored = CAPSTONE / path.name
        assert stored.exists(), f"{stored} is missing; run python scripts/make_capstone_traces.py"
        assert stored.read_bytes() == path.read_bytes(), \
            f"{stored} is stale; run python scripts/make_capstone_traces.py"


def test_files_are_small_and_unlabelled():
    script = _script()
    for config in script.CONFIGS:
        path = CAPSTONE / f"{config.name}.json"
        assert path.stat().st_size < 300_000, f"{path.name} is {path.stat().st_size} bytes"
        meta = json.loads(path.read_text())["meta"]
        assert set(meta) == {"name", "made_by", "backend", "cost_model"}, meta
        trace = load_trace(path)
        counts = metrics.request_counts(trace)
        assert counts["num_finished"] == counts["num_requests"] >= 150, counts


def test_key_covers_the_exercises_and_uses_known_knobs():
    script = _script()
    assert set(nb11.KNOBS) == set(script.KNOBS)
    assert set(nb11.EXERCISE_TRACES.values()) == set(nb11.answer_key())
    assert set(_keys()) == {c.name for c in script.CONFIGS}
    for slow, knob in _keys().values():
        assert slow in nb11.SLOW and knob in nb11.KNOBS


@pytest.mark.parametrize("name", ["example", "trace_a", "trace_b", "trace_c", "trace_d"])
def test_keyed_latency_is_where_the_waiting_goes(name):
    slow, _ = _keys()[name]
    share = excess_share_before_first_token(load_trace(CAPSTONE / f"{name}.json"), _cost())
    assert (share > 0.6) if slow == "ttft" else (share < 0.4), (name, share)


def _symptom(trace, slow: str) -> float:
    """The number a user with this complaint would watch: p90 TTFT, or p99 inter-token gap."""
    summary = metrics.summarize(trace)
    return summary.loc["ttft", "p90"] if slow == "ttft" else summary.loc["itl", "p99"]


@pytest.mark.parametrize("name", ["example", "trace_a", "trace_b", "trace_c", "trace_d"])
def test_keyed_knob_is_the_one_that_helps(name):
    script = _script()
    config = next(c for c in script.CONFIGS if c.name == name)
    slow, knob = _keys()[name]
    requests = script.workload(config, _cost())
    before = _symptom(script.serve(config, requests, _cost()), slow)
    gain = {k: before / _symptom(script.serve(script.with_knob(config, k), requests, _cost()), slow)
            for k in script.KNOBS}
    if knob in FREE_KNOBS:
        assert gain[knob] > 2.0, (name, gain)
        assert all(gain[k] < 0.6 * gain[knob] for k in FREE_KNOBS if k != knob), (name, gain)
    else:
        assert all(gain[k] < 1.25 for k in FREE_KNOBS), (name, gain)
        assert gain["more_capacity"] > 1.5, (name, gain)
