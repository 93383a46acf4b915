"""The cost model: its features, the NNLS fit, recovering known coefficients, saving and loading."""

from __future__ import annotations

import itertools
import json
import warnings

import numpy as np
import pandas as pd
import pytest

from batchlab.sim import SimBackend
from batchlab.steptime.cost_model import FEATURES, CostModel, features_df, nnls
from batchlab.engine import Engine
from batchlab.plan import ScheduledChunk, StepPlan, chunk_attention_pairs, step_features
from batchlab.requests import Request
from batchlab.schedulers import ContinuousBatcher
from batchlab.trace import StepRecord

# Known coefficients for synthetic data: 15 ms per step, 0.3 ms per sequence, 2 ms per token,
# 0.2 µs per attention pair (made-up numbers of a plausible size, not a measurement).
TRUE = CostModel(fixed_s=0.015, per_seq_s=0.0003, per_token_s=0.002, per_attention_pair_s=2e-7)


def random_steps(num_steps: int, seed: int) -> list[list[ScheduledChunk]]:
    """Varied steps: decode batches of 1-32 sequences at contexts up to 4000, plus prompt chunks."""
    rng = np.random.default_rng(seed)
    steps = []
    for i in range(num_steps):
        chunks = [ScheduledChunk(f"d{j}", int(rng.integers(1, 4000)), 1, True)
                  for j in range(int(rng.integers(0, 33)))]
        for j in range(int(rng.integers(0 if chunks else 1, 3))):
            chunks.append(ScheduledChunk(f"p{j}", int(rng.integers(0, 2000)), int(rng.integers(2, 400)), False))
        steps.append(chunks)
    return steps


def measured(steps: list[list[ScheduledChunk]], noise: float, seed: int) -> list[StepRecord]:
    """StepRecords whose durations follow TRUE times a lognormal factor of spread ``noise``."""
    rng = np.random.default_rng(seed)
    factors = np.exp(noise * rng.standard_normal(len(steps)))
    t, records = 0.0, []
    for i, (chunks, f) in enumerate(zip(steps, factors)):
        d = TRUE.predict(chunks) * f
        records.append(StepRecord(i, t, d, chunks))
        t += d
    return records


# --- features -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("start,num", [(0, 1), (7, 1), (0, 5), (12, 9), (300, 1)])
def test_attention_pairs_count_every_query_key_pair(start, num):
    brute = sum(q + 1 for q in range(start, start + num))   # query q sees keys 0..q
    assert chunk_attention_pairs(start, num) == brute


def test_step_features_of_a_mixed_step():
    chunks = [ScheduledChunk("a", 9, 1, True), ScheduledChunk("b", 0, 4, True)]
    assert step_features(chunks) == (2, 5, 10 + (1 + 2 + 3 + 4))
    assert step_features([]) == (0, 0, 0)


def test_predict_accepts_plans_records_and_chunks():
    chunks = [ScheduledChunk("a", 9, 1, True), ScheduledChunk("b", 0, 4, True)]
    expected = 0.015 + 0.0003 * 2 + 0.002 * 5 + 2e-7 * 20
    assert TRUE.predict(chunks) == pytest.approx(expected)
    assert TRUE.predict(StepPlan(chunks)) == TRUE.predict(StepRecord(0, 0.0, 1.0, chunks)) == TRUE.predict(chunks)
    assert TRUE.predict(StepPlan()) == 0.0
    table = features_df([StepRecord(0, 0.0, 1.0, chunks)])
    assert TRUE.predict_df(table) == pytest.approx([expected])


# --- the solver ---------------------------------------------------------------------------------------
def brute_force_nnls(a, b):
    """Try every set of coefficients pinned at zero; keep the best feasible least-squares fit."""
    n = a.shape[1]
    best, best_err = np.zeros(n), np.sum(b ** 2)
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            x = np.zeros(n)
            x[list(cols)] = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
            err = np.sum((a @ x - b) ** 2)
            if x.min() >= 0 and err < best_err - 1e-12:
                best, best_err = x, err
    return best


@pytest.mark.parametrize("seed", range(8))
def test_nnls_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(30, 4))
    b = a @ rng.normal(size=4) + 0.1 * rng.normal(size=30)   # true x has negative parts
    x = nnls(a, b)
    assert x.min() >= 0
    assert x == pytest.approx(brute_force_nnls(a, b), abs=1e-8)


def test_nnls_equals_least_squares_when_that_is_already_non_negative():
    rng = np.random.default_rng(0)
    a = rng.uniform(size=(50, 3))
    b = a @ np.array([1.0, 2.0, 3.0])
    assert nnls(a, b) == pytest.approx([1.0, 2.0, 3.0])


# --- fitting ------------------------------------------------------------------------------------------
# Absolute errors let the long prompt steps dominate, so the small per-sequence cost is pinned
# down less tightly than with relative errors; that fit gets less noisy data.
@pytest.mark.parametrize("weight,noise", [("relative", 0.02), ("absolute", 0.005)])
def test_fit_recovers_known_coefficients(weight, noise):
    records = measured(random_steps(600, seed=1), noise=noise, seed=2)
    fit = CostModel.fit(records, weight=weight)
    for name, true, got in zip(("fixed", "per_seq", "per_token", "per_pair"), TRUE.coefficients, fit.coefficients):
        assert got == pytest.approx(true, rel=0.1), name
    assert fit.fit_stats["num_steps"] == 600
    assert fit.fit_stats["r2"] > 0.99
    assert fit.fit_stats["median_rel_error"] < 0.03


def test_fit_without_noise_is_exact():
    records = measured(random_steps(50, seed=3), noise=0.0, seed=0)
    fit = CostModel.fit(records)
    assert fit.coefficients == pytest.approx(TRUE.coefficients, rel=1e-6)


def test_a_cost_that_is_not_there_is_fitted_as_zero_not_negative():
    truth = CostModel(0.01, 0.0, 0.002, 0.0)
    steps = random_steps(300, seed=4)
    rng = np.random.default_rng(5)
    records = [StepRecord(i, 0.0, truth.predict(c) * float(np.exp(0.05 * rng.standard_normal())), c)
               for i, c in enumerate(steps)]
    fit = CostModel.fit(records)
    assert min(fit.coefficients) >= 0
    assert fit.per_token_s == pytest.approx(0.002, rel=0.05)
    assert fit.per_seq_s < 1e-4 and fit.per_attention_pair_s < 2e-8


def test_fit_accepts_a_trace_and_a_table():
    # End to end: simulate with TRUE plus noise, then fit the simulator's own trace.
    requests = [Request(f"r{i}", None, 5 + 7 * (i % 5), arrival_time=0.05 * i, prompt_len=3 + 23 * (i % 9))
                for i in range(60)]
    trace = Engine(ContinuousBatcher(8, 96), SimBackend(TRUE, 100_000, noise=0.02, seed=1)).run(requests)
    from_trace = CostModel.fit(trace)
    table = features_df(trace)
    assert list(table.columns) == ["step", *FEATURES, "duration"]
    assert table["step"].tolist() == trace.steps_df()["step"].tolist()
    from_table = CostModel.fit(table)
    assert from_trace.coefficients == pytest.approx(from_table.coefficients)
    assert from_trace.per_token_s == pytest.approx(TRUE.per_token_s, rel=0.1)
    assert from_trace.fixed_s == pytest.approx(TRUE.fixed_s, rel=0.15)


def test_decode_only_steps_warn_that_costs_cannot_be_told_apart():
    steps = [[ScheduledChunk(f"d{j}", 100, 1, True) for j in range(n)] for n in range(1, 20)]
    records = [StepRecord(i, 0.0, TRUE.predict(c), c) for i, c in enumerate(steps)]
    with pytest.warns(UserWarning, match="do not vary enough"):
        CostModel.fit(records)


def test_fit_refuses_bad_data():
    good = measured(random_steps(10, seed=6), noise=0.0, seed=0)
    with pytest.raises(ValueError, match=r"weight='squared'; must be one of \['relative', 'absolute'\]"):
        CostModel.fit(good, weight="squared")
    with pytest.raises(ValueError, match="3 steps cannot determine 4"):
        CostModel.fit(good[:3])
    bad = [StepRecord(s.index, s.start, 0.0 if s.index == 2 else s.duration, s.chunks) for s in good]
    with pytest.raises(ValueError, match="duration"):
        CostModel.fit(bad)
    with pytest.raises(ValueError, match=r"lacks columns \['attention_pairs'\]"):
        CostModel.fit(pd.DataFrame({"num_seqs": [1] * 5, "num_tokens": [1] * 5, "duration": [1.0] * 5}))
    with pytest.raises(ValueError, match=r"steps\[0\]=\{'duration': 1.0\}; must be a StepRecord"):
        CostModel.fit([{"duration": 1.0}] * 5)


# --- the model as a value -----------------------------------------------------------------------------
def test_coefficients_must_be_non_negative_and_finite():
    with pytest.raises(ValueError, match=r"per_token_s=-0.001; must be a finite number >= 0 \(a cost"):
        CostModel(0.01, 0.0, -0.001, 0.0)
    with pytest.raises(ValueError, match="fixed_s=nan"):
        CostModel(float("nan"), 0.0, 0.0, 0.0)


def test_save_and_load_round_trip(tmp_path):
    fit = CostModel.fit(measured(random_steps(60, seed=7), noise=0.02, seed=8), source="synthetic test data")
    path = tmp_path / "cost.json"
    fit.save(path)
    data = json.loads(path.read_text())
    assert data["formula"].startswith("t_step = fixed_s") and data["source"] == "synthetic test data"
    again = CostModel.load(path)
    assert again == fit and again.fit_stats == fit.fit_stats
    assert CostModel.from_dict(fit.to_dict()) == fit


def test_loading_checks_what_it_reads():
    with pytest.raises(ValueError, match=r"lacks \['per_attention_pair_s'\]"):
        CostModel.from_dict({"fixed_s": 0.01, "per_seq_s": 0, "per_token_s": 0.001})
    data = TRUE.to_dict() | {"formula": "t = a + b*x"}
    with pytest.raises(ValueError, match="formula"):
        CostModel.from_dict(data)


def test_repr_reads_in_milliseconds_per_term():
    text = repr(TRUE)
    assert text == "CostModel(15 ms/step + 0.3 ms/seq + 2 ms/token + 0.2 µs/attention pair)"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit = CostModel.fit(measured(random_steps(40, seed=9), noise=0.02, seed=1))
    assert "fit on 40 steps, median error" in repr(fit)


def test_calibration_warns_on_a_poor_fit():
    from batchlab.experiments.calibration import POOR_FIT_ERROR, warn_if_poor_fit

    good = CostModel(0.02, 0.001, 0.001, 1e-7, fit_stats={"median_rel_error": POOR_FIT_ERROR / 2})
    bad = CostModel(0.02, 0.001, 0.001, 1e-7, fit_stats={"median_rel_error": 2 * POOR_FIT_ERROR})
    by_hand = CostModel(0.02, 0.001, 0.001, 1e-7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_if_poor_fit(good) is False and warn_if_poor_fit(by_hand) is False
    with pytest.warns(RuntimeWarning, match=r"misses its own measured steps by 30%"):
        assert warn_if_poor_fit(bad) is True
