"""batchlab.experiments.prefill_stall: the stall experiment's workload, measurements and sweep (simulator only)."""

import math

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest

matplotlib.use("Agg")

from batchlab.analysis.diagnosis import token_gaps
from batchlab.sim import SimBackend
from batchlab.steptime.cost_model import CostModel
from batchlab.engine import Engine
from batchlab.experiments.prefill_stall import (
    StallScenario,
    budget_sweep,
    long_prompt_len_for,
    plot_token_gaps,
    prefill_window,
    stall_summary,
)
from batchlab.schedulers import ContinuousBatcher

# 10 ms per step plus 1 ms per token: a step's duration tells exactly how many tokens it computed.
PER_TOKEN = CostModel(fixed_s=0.010, per_seq_s=0.0, per_token_s=0.001, per_attention_pair_s=0.0)


def _sim(scenario: StallScenario, cost: CostModel = PER_TOKEN) -> SimBackend:
    return SimBackend(cost, kv_capacity_tokens=8 * scenario.max_seq_len)


def _run(scenario: StallScenario, budget: int = 2048, chunked: bool = True, requests=None):
    scheduler = ContinuousBatcher(max_num_seqs=scenario.max_num_seqs, max_num_batched_tokens=budget,
                                  chunked_prefill=chunked)
    return Engine(scheduler, _sim(scenario)).run(requests or scenario.requests())


def test_scenario_builds_the_requests():
    scenario = StallScenario(num_running=3, running_prompt_len=8, running_output_len=20,
                             short_output_len=5, long_prompt_len=100, long_output_len=4)
    reqs = scenario.requests()
    assert [r.request_id for r in reqs] == ["run000", "run001", "run002", "short000", "long000"]
    assert scenario.running_ids == ["run000", "run001", "run002"]
    assert (scenario.short_id, scenario.long_id, scenario.max_num_seqs) == ("short000", "long000", 4)
    assert all(r.arrival_time == 0.0 for r in reqs)
    assert [(r.prompt_len, r.max_new_tokens) for r in reqs] == [(8, 20)] * 3 + [(8, 5), (100, 4)]
    assert all(r.prompt_ids is None for r in reqs)          # no tokenizer: simulated
    assert [r.request_id for r in scenario.control_requests()] == ["run000", "run001", "run002", "short000"]
    assert scenario.max_seq_len == 104


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_running=0), "num_running=0"),
    (dict(long_prompt_len=2.5), "long_prompt_len=2.5"),
    (dict(running_output_len=True), "running_output_len=True"),
    (dict(short_output_len=48), "short_output_len=48; must be < running_output_len=48"),
])
def test_scenario_rejects_bad_sizes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StallScenario(**kwargs)


def test_the_long_prompt_joins_the_step_after_the_short_answer_ends():
    scenario = StallScenario(num_running=3, running_output_len=20, short_output_len=5, long_prompt_len=60)
    trace = _run(scenario)
    short = next(r for r in trace.requests if r.request_id == "short000")
    start, _ = prefill_window(trace, scenario.long_id)
    assert start == short.token_times[-1]                  # the very next step
    chunks = trace.chunks_df()
    admitted = chunks[chunks.start == start]
    assert sorted(admitted.request_id) == ["long000", "run000", "run001", "run002"]
    assert (admitted[admitted.request_id != "long000"].kind == "decode").all()


def test_token_gaps_follow_the_token_times():
    scenario = StallScenario(num_running=2, running_output_len=6, short_output_len=2,
                             long_prompt_len=40, long_output_len=3)
    trace = _run(scenario)
    gaps = token_gaps(trace)
    assert len(gaps) == (2 * 6 + 2 + 3) - len(trace.requests)   # one gap fewer than tokens each
    for record in trace.requests:
        mine = gaps[gaps.request_id == record.request_id]
        assert mine["time"].tolist() == record.token_times[1:]
        assert mine["token_index"].tolist() == list(range(1, len(record.token_times)))
        assert np.allclose(mine["gap"], np.diff(record.token_times))
    assert set(token_gaps(trace, ["run000"]).request_id) == {"run000"}
    with pytest.raises(ValueError, match="nope"):
        token_gaps(trace, ["nope"])


def test_whole_prompt_stalls_the_running_requests():
    scenario = StallScenario(num_running=4, running_output_len=20, long_prompt_len=200)
    trace = _run(scenario, chunked=False)
    s = stall_summary(trace, scenario.long_id)
    decode_step = 0.010 + 5 * 0.001                       # five sequences decode, before and after
    stall_step = 0.010 + (4 + 200) * 0.001                 # 4 decodes and the whole prompt
    assert s["long_prefill_steps"] == 1
    assert s["admission_gap"] == pytest.approx(stall_step)
    assert s["running_itl_max"] == pytest.approx(stall_step)
    assert s["prefill_itl_max"] == pytest.approx(stall_step)
    assert s["running_itl_median"] == pytest.approx(decode_step)
    assert s["stall_ratio"] == pytest.approx(stall_step / decode_step)
    assert s["prefill_itl_max_rel"] == pytest.approx(stall_step / decode_step)
    assert s["long_prefill_time_rel"] == pytest.approx(stall_step / decode_step)
    start, first_token = prefill_window(trace, scenario.long_id)
    assert first_token - start == pytest.approx(stall_step) == pytest.approx(s["long_prefill_time"])
    assert s["long_ttft"] == pytest.approx(first_token)    # it arrived at 0 and waited for a slot


def test_chunked_prefill_splits_the_prompt_by_the_budget():
    scenario = StallScenario(num_running=4, running_output_len=40, long_prompt_len=200)
    trace = _run(scenario, budget=36)
    s = stall_summary(trace, scenario.long_id)
    # Decodes first (4 tokens), 32 left for the prompt each step: 200 / 32 -> 7 steps.
    assert s["long_prefill_steps"] == math.ceil(200 / 32)
    assert s["running_itl_max"] == pytest.approx(0.010 + 36 * 0.001)
    assert s["prefill_itl_max"] == pytest.approx(0.010 + 36 * 0.001)
    # After the prompt, the running requests decode beside the newcomer: 5 decodes a step.
    gaps = token_gaps(trace, scenario.running_ids)
    start, first_token = prefill_window(trace, scenario.long_id)
    assert gaps.loc[gaps.time > first_token + 1e-9, "gap"].max() == pytest.approx(0.010 + 5 * 0.001)


def test_budget_sweep_rows_and_traces():
    scenario = StallScenario(num_running=4, running_output_len=40, long_prompt_len=200)
    sweep = budget_sweep(_sim(scenario), scenario.requests(), [None, 20, 68],
                         scenario.max_num_seqs, long_id=scenario.long_id)
    assert sweep["max_num_batched_tokens"].tolist() == [2048, 20, 68]
    assert sweep["chunked_prefill"].tolist() == [False, True, True]
    assert sweep["long_prefill_steps"].tolist() == [1, math.ceil(200 / 16), math.ceil(200 / 64)]
    assert set(sweep.attrs["traces"]) == {None, 20, 68}
    # The trade: less budget, smaller worst gap, later first token for the newcomer.
    assert sweep["running_itl_max"].iloc[1] < sweep["running_itl_max"].iloc[2] < sweep["running_itl_max"].iloc[0]
    assert sweep["long_ttft"].iloc[1] > sweep["long_ttft"].iloc[2] > sweep["long_ttft"].iloc[0]


def test_long_prompt_len_for_reaches_the_target_ratio():
    cost = CostModel(fixed_s=0.040, per_seq_s=0.004, per_token_s=0.0006, per_attention_pair_s=2e-8)
    length = long_prompt_len_for(cost, num_running=4, context_len=32, target_ratio=6.0)
    assert length % 16 == 0

    def ratio(n):
        decode_pairs = 4 * 33
        return (cost.predict_features(5, 4 + n, decode_pairs + n * (n + 1) // 2)
                / cost.predict_features(4, 4, decode_pairs))
    assert ratio(length) >= 6.0 > ratio(length - 16)
    # A device where a step costs only its fixed part can never reach the target: the cap.
    flat = CostModel(fixed_s=0.01, per_seq_s=0.0, per_token_s=0.0, per_attention_pair_s=0.0)
    assert long_prompt_len_for(flat, 4, max_len=512) == 512
    with pytest.raises(ValueError, match="target_ratio=1; must be a finite number > 1"):
        long_prompt_len_for(cost, 4, target_ratio=1)


def test_plot_token_gaps_draws_the_prefill_window():
    scenario = StallScenario(num_running=2, running_output_len=10, long_prompt_len=50)
    trace = _run(scenario)
    ax = plot_token_gaps(trace, scenario.long_id, title="t")
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["the other 3 requests (lines overlap)", "long000 prefill (joins → first token)"]
    assert ax.get_ylabel() == "gap since previous token (ms)"
    with pytest.raises(ValueError, match=r"unit='us'; must be one of \['ms', 's'\]"):
        plot_token_gaps(trace, scenario.long_id, unit="us")
    plt.close("all")


def test_a_newcomer_after_everyone_left_is_reported_not_measured():
    scenario = StallScenario(num_running=2, running_output_len=4, short_output_len=2, long_prompt_len=30)
    late = scenario.requests()
    late[-1].arrival_time = 10.0                           # long after the others are done
    with pytest.raises(ValueError, match="no other request was decoding"):
        stall_summary(_run(scenario, requests=late), scenario.long_id)
