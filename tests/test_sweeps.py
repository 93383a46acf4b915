"""load_sweep: one row per (policy, rate), fresh state per run, numbers worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from batchlab.analysis.metrics import SLO, summary_row
from batchlab.sim import SimBackend
from batchlab.steptime.cost_model import CostModel
from batchlab.engine import Engine
from batchlab.experiments.sweeps import capacity, load_sweep, run_point
from batchlab.schedulers import ContinuousBatcher, DynamicBatcher
from batchlab.workloads import make_workload

# Every step takes 0.1 s whatever it holds, so latencies can be worked out by hand.
TENTH = CostModel(fixed_s=0.1, per_seq_s=0.0, per_token_s=0.0, per_attention_pair_s=0.0)
# A cost model of the usual shape (fixed + per sequence + per token + per attention pair).
SHAPED = CostModel(fixed_s=0.04, per_seq_s=0.002, per_token_s=0.0007, per_attention_pair_s=1e-7)


def sim(cost: CostModel = TENTH):
    return lambda: SimBackend(cost, kv_capacity_tokens=8192)


def one_token_workload(rate: float):
    """4 requests of 1 output token each, exactly 1/rate s apart."""
    return make_workload(4, prompt_len=8, output_len=1, arrival="fixed", rate=rate)


def chat(rate: float):
    return make_workload(60, "chat", arrival="poisson", rate=rate, seed=3)


POLICIES = {
    "dynamic": lambda: DynamicBatcher(max_batch_size=8, timeout=0.05, stream=True),
    "continuous": lambda: ContinuousBatcher(max_num_seqs=8, max_num_batched_tokens=128),
}


def test_one_row_per_policy_and_rate_in_order():
    df = load_sweep(chat, [1.0, 4.0, 2.0], POLICIES, sim(SHAPED), progress=False)
    assert list(zip(df["policy"], df["request_rate"])) == [
        ("dynamic", 1.0), ("dynamic", 4.0), ("dynamic", 2.0),
        ("continuous", 1.0), ("continuous", 4.0), ("continuous", 2.0)]
    expected_cols = ["policy", "request_rate", *summary_row(
        Engine(POLICIES["continuous"](), sim(SHAPED)()).run(chat(1.0)))]
    assert list(df.columns) == expected_cols
    assert (df["num_finished"] == 60).all()
    assert pd.api.types.is_float_dtype(df["ttft_p99"])


def test_hand_worked_latencies():
    # rate 1: each request is alone; its one step takes 0.1 s, so TTFT = 0.1 for all.
    # rate 100 (arrivals 0, 0.01, 0.02, 0.03): r000 runs 0-0.1 alone; the other three arrive
    # during that step and share the next one, 0.1-0.2: TTFTs 0.19, 0.18, 0.17.
    df = load_sweep(one_token_workload, [1.0, 100.0],
                    {"continuous": lambda: ContinuousBatcher(max_num_seqs=8, max_num_batched_tokens=64)},
                    sim(), progress=False).set_index("request_rate")
    assert df.loc[1.0, "ttft_p50"] == pytest.approx(0.1)
    assert df.loc[1.0, "ttft_p99"] == pytest.approx(0.1)
    assert df.loc[100.0, "ttft_p50"] == pytest.approx(np.percentile([0.1, 0.19, 0.18, 0.17], 50))
    assert df.loc[100.0, "ttft_p99"] == pytest.approx(np.percentile([0.1, 0.19, 0.18, 0.17], 99))
    # Two steps in all at rate 100; the run lasts from 0 to 0.2 s.
    assert df.loc[100.0, "num_steps"] == 2
    assert df.loc[100.0, "duration"] == pytest.approx(0.2)


def test_rows_equal_separate_runs_so_no_state_leaks_between_runs():
    rates = [0.5, 3.0]
    df = load_sweep(chat, rates, POLICIES, sim(SHAPED), progress=False)
    for name, factory in POLICIES.items():
        for rate in rates:
            alone = summary_row(Engine(factory(), sim(SHAPED)()).run(chat(rate)))
            row = df[(df["policy"] == name) & (df["request_rate"] == rate)].iloc[0]
            for key in ("ttft_p50", "ttft_p99", "itl_p50", "e2e_p90", "request_throughput"):
                assert row[key] == pytest.approx(alone[key]), (name, rate, key)


def test_higher_rate_means_longer_queues_for_dynamic_batching():
    # At a low rate a dynamic batch mostly waits its timeout; at a high rate requests also wait
    # for the running batch, so the first token comes later.
    df = load_sweep(chat, [0.2, 20.0], {"dynamic": POLICIES["dynamic"]}, sim(SHAPED), progress=False)
    low, high = df["ttft_p50"].to_numpy()
    assert high > 2 * low, (low, high)


def test_factories_are_called_once_per_run_and_workloads_once_per_rate():
    calls = {"workload": 0, "scheduler": 0, "backend": 0}

    def workload(rate):
        calls["workload"] += 1
        return chat(rate)

    def scheduler():
        calls["scheduler"] += 1
        return ContinuousBatcher(max_num_seqs=4, max_num_batched_tokens=64)

    def backend():
        calls["backend"] += 1
        return SimBackend(SHAPED, kv_capacity_tokens=4096)

    load_sweep(workload, [1.0, 2.0, 3.0], {"a": scheduler, "b": scheduler}, backend, progress=False)
    assert calls == {"workload": 3, "scheduler": 6, "backend": 6}


def test_slo_adds_goodput():
    slo = SLO(ttft=0.3)
    df = load_sweep(chat, [0.5, 30.0], POLICIES, sim(SHAPED), slo=slo, progress=False)
    assert {"num_good", "goodput"} <= set(df.columns)
    assert (df["goodput"] <= df["request_throughput"] + 1e-12).all()
    # A dict works as well as an SLO.
    df2 = load_sweep(chat, [0.5, 30.0], POLICIES, sim(SHAPED), slo={"ttft": 0.3}, progress=False)
    assert np.allclose(df["goodput"], df2["goodput"])
    # Without an SLO there is no goodput column.
    assert "goodput" not in load_sweep(chat, [1.0], POLICIES, sim(SHAPED), progress=False).columns


def test_progress_bar_runs():
    df = load_sweep(chat, [1.0], POLICIES, sim(SHAPED), progress=True)
    assert len(df) == 2


@pytest.mark.parametrize("rates", [[], [0.0], [-1.0], [math.nan], [math.inf], [True], ["2"]])
def test_bad_rates_are_rejected(rates):
    with pytest.raises(ValueError, match=r"rates(\[0\])?=.*; must be "):
        load_sweep(chat, rates, POLICIES, sim(), progress=False)


def test_rates_must_be_a_collection():
    with pytest.raises(ValueError, match=r"rates=2.0; must be a non-empty list of request rates"):
        load_sweep(chat, 2.0, POLICIES, sim(), progress=False)


def test_a_scheduler_object_is_not_a_factory():
    with pytest.raises(ValueError, match="factory"):
        load_sweep(chat, [1.0], {"c": ContinuousBatcher()}, sim(), progress=False)
    with pytest.raises(ValueError, match="non-empty dict"):
        load_sweep(chat, [1.0], {}, sim(), progress=False)
    with pytest.raises(ValueError, match=r"policies\['c'\]=3; must be a function that returns a new Scheduler"):
        load_sweep(chat, [1.0], {"c": 3}, sim(), progress=False)


def test_bad_factories_are_named():
    with pytest.raises(ValueError, match="workload_fn"):
        load_sweep([], [1.0], POLICIES, sim(), progress=False)
    with pytest.raises(ValueError, match="backend_factory"):
        load_sweep(chat, [1.0], POLICIES, SimBackend(TENTH, kv_capacity_tokens=64), progress=False)
    with pytest.raises(ValueError, match="scheduler='continuous'; must be a batchlab Scheduler"):
        load_sweep(chat, [1.0], {"bad": lambda: "continuous"}, sim(), progress=False)
    with pytest.raises(ValueError, match="backend=None; must be a batchlab Backend"):
        load_sweep(chat, [1.0], POLICIES, lambda: None, progress=False)


def test_errors_say_which_point_failed():
    # Nothing can finish when every request is rejected (the cache holds 8 tokens): the message
    # names the policy and the rate.
    tiny = lambda: SimBackend(TENTH, kv_capacity_tokens=8)  # noqa: E731
    with pytest.raises(ValueError, match=r"policy 'continuous' at rate 2 req/s"):
        load_sweep(chat, [2.0], {"continuous": POLICIES["continuous"]}, tiny, progress=False)


def test_run_point_is_one_summary_row_and_its_trace():
    reqs = chat(2.0)
    row, trace = run_point(reqs, POLICIES["continuous"](), sim(SHAPED)())
    alone = Engine(POLICIES["continuous"](), sim(SHAPED)()).run(reqs)
    assert row == pytest.approx(summary_row(alone), nan_ok=True)
    assert [s.duration for s in trace.steps] == [s.duration for s in alone.steps]


def test_keep_traces():
    df = load_sweep(chat, [1.0, 2.0], POLICIES, sim(SHAPED), progress=False, keep_traces=True)
    traces = df.attrs["traces"]
    assert sorted(traces) == sorted((p, r) for p in POLICIES for r in (1.0, 2.0))
    for _, row in df.iterrows():
        trace = traces[(row["policy"], row["request_rate"])]
        assert summary_row(trace)["ttft_p99"] == pytest.approx(row["ttft_p99"])
    assert "traces" not in load_sweep(chat, [1.0], POLICIES, sim(SHAPED), progress=False).attrs
    with pytest.raises(ValueError, match="keep_traces"):
        load_sweep(chat, [1.0], POLICIES, sim(SHAPED), progress=False, keep_traces="yes")


def test_capacity_serves_everything_at_once():
    # 4 one-token requests at t = 0; each step takes 0.1 s. With room for 8 they share one step:
    # 4 requests / 0.1 s = 40 req/s. With room for 2 they need two steps: 20 req/s.
    reqs = one_token_workload(0.5)             # arrivals 0, 2, 4, 6 s are ignored
    wide = capacity(reqs, lambda: ContinuousBatcher(max_num_seqs=8, max_num_batched_tokens=64), sim())
    narrow = capacity(reqs, lambda: ContinuousBatcher(max_num_seqs=2, max_num_batched_tokens=64), sim())
    assert wide == pytest.approx(40.0)
    assert narrow == pytest.approx(20.0)
    assert [r.arrival_time for r in reqs] == [0.0, 2.0, 4.0, 6.0]   # inputs untouched
    with pytest.raises(ValueError, match="new Scheduler"):
        capacity(reqs, ContinuousBatcher(), sim())
