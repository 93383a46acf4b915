"""Calibration measures real steps on either cache kind and fits the simulator's cost model to them."""

from __future__ import annotations

import math

import pytest

from batchlab.backends import CostModel, ModelBackend
from batchlab.engine_args import EngineArgs
from batchlab.experiments.calibration import calibration_trace, fit_calibration, lone_prompt_steps


@pytest.mark.parametrize("paged", [False, True], ids=["slots", "paged"])
def test_calibration_runs_on_slots_and_on_blocks(lm, paged):
    backend = ModelBackend(lm, num_slots=4, max_seq_len=512, paged=paged)
    trace = calibration_trace(backend, num_requests=4, args=EngineArgs(max_num_seqs=4, max_num_batched_tokens=64))
    assert (trace.requests_df()["status"] == "finished").all()
    assert backend.kv.used_tokens == 0                       # everything freed at the end
    steps = trace.steps[1:] + lone_prompt_steps(backend, lengths=(96,))
    # A lone 96-token prompt in one step, then a 256-token prompt alone in chunks of 32 and 64.
    assert {s.num_tokens for s in steps} >= {96, 64, 32}
    cost = fit_calibration(backend, steps)
    assert isinstance(cost, CostModel) and cost.fit_stats["num_steps"] == len(steps)
    assert all(math.isfinite(c) and c >= 0 for c in cost.coefficients)
    # A 96-token prompt costs more than one decode of a single sequence, on any device.
    assert cost.predict_features(1, 96, 96 * 97 // 2) > cost.predict_features(1, 1, 100)
