"""batchlab.prefill_stall: the stall experiment's workload, measurements and sweep (simulator only)."""

import math

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest

matplotlib.use("Agg")

from batchlab.backends import SimBackend
from batchlab.cost_model import CostModel
from batchlab.engine import Engine
from batchlab.prefill_stall import (StallScenario, arrival_after_tokens, budget_sweep,
                                    long_prompt_len_for, plot_token_gaps, prefill_window,
                                    stall_summary, token_gaps)
from batchlab.schedulers import ContinuousBatcher

# 10 ms per step plus 1 ms per token: a step's duration tells exactly how many tokens it computed.
PER_TOKEN = CostModel(fixed_s=0.010, per_seq_s=0.0, per_token_s=0.001, per_attention_pair_s=0.0)


def _sim(scenario: StallScenario, cost: CostModel = PER_TOKEN) -> SimBackend:
    return SimBackend(cost, kv_capacity_tokens=8 * scenario.max_seq_len)


def _stalled(scenario: StallScenario, sim: SimBackend, after: int = 5):
    control = Engine(ContinuousBatcher(max_num_seqs=8), sim).run(scenario.running_requests())
    return scenario.requests(arrival_after_tokens(control, after))


def test_scenario_builds_the_requests():
    scenario = StallScenario(num_running=3, running_prompt_len=8, running_output_len=20,
                             long_prompt_len=100, long_output_len=4)
    reqs = scenario.requests(1.5)
    assert [r.request_id for r in reqs] == ["run000", "run001", "run002", "long000"]
    assert scenario.running_ids == ["run000", "run001", "run002"] and scenario.long_id == "long000"
    assert [r.arrival_time for r in reqs] == [0.0, 0.0, 0.0, 1.5]
    assert [(r.prompt_len, r.max_new_tokens) for r in reqs] == [(8, 20)] * 3 + [(100, 4)]
    assert all(r.prompt_ids is None for r in reqs)          # no tokenizer: simulated
    assert scenario.max_seq_len == 104


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_running=0), "num_running=0"),
    (dict(long_prompt_len=2.5), "long_prompt_len=2.5"),
    (dict(running_output_len=True), "running_output_len=True"),
])
def test_scenario_rejects_bad_sizes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StallScenario(**kwargs)


def test_requests_reject_a_bad_arrival():
    with pytest.raises(ValueError, match="long_arrival=-1"):
        StallScenario().requests(-1)


def test_arrival_after_tokens_is_the_kth_token_time():
    scenario = StallScenario(num_running=2, running_output_len=10)
    control = Engine(ContinuousBatcher(max_num_seqs=4), _sim(scenario)).run(scenario.running_requests())
    # Step 1: two 16-token prompts (10 + 32 ms); later steps: two decodes (12 ms each).
    assert arrival_after_tokens(control, 1) == pytest.approx(0.042)
    assert arrival_after_tokens(control, 4) == pytest.approx(0.042 + 3 * 0.012)
    with pytest.raises(ValueError, match="num_tokens=11"):
        arrival_after_tokens(control, 11)


def test_token_gaps_follow_the_token_times():
    scenario = StallScenario(num_running=2, running_output_len=6, long_prompt_len=40, long_output_len=3)
    sim = _sim(scenario)
    trace = Engine(ContinuousBatcher(max_num_seqs=4), sim).run(_stalled(scenario, sim, after=2))
    gaps = token_gaps(trace)
    assert len(gaps) == 2 * 6 + 3
    for record in trace.requests:
        mine = gaps[gaps.request_id == record.request_id]
        assert mine["time"].tolist() == record.token_times
        assert math.isnan(mine["gap"].iloc[0])
        assert np.allclose(mine["gap"].iloc[1:], np.diff(record.token_times))
    assert set(token_gaps(trace, ["run000"]).request_id) == {"run000"}
    with pytest.raises(ValueError, match="nope"):
        token_gaps(trace, ["nope"])


def test_whole_prompt_stalls_the_running_requests():
    scenario = StallScenario(num_running=4, running_output_len=20, long_prompt_len=200)
    sim = _sim(scenario)
    trace = Engine(ContinuousBatcher(max_num_seqs=8, chunked_prefill=False), sim).run(
        _stalled(scenario, sim))
    s = stall_summary(trace, scenario.long_id)
    decode_step = 0.010 + 4 * 0.001
    stall_step = 0.010 + (4 + 200) * 0.001                 # 4 decodes and the whole prompt
    assert s["long_prefill_steps"] == 1
    assert s["admission_gap"] == pytest.approx(stall_step)
    assert s["running_itl_max"] == pytest.approx(stall_step)
    assert s["prefill_itl_max"] == pytest.approx(stall_step)
    assert s["running_itl_median"] == pytest.approx(decode_step)
    assert s["stall_ratio"] == pytest.approx(stall_step / decode_step)
    start, first_token = prefill_window(trace, scenario.long_id)
    assert first_token - start == pytest.approx(stall_step)


def test_chunked_prefill_splits_the_prompt_by_the_budget():
    scenario = StallScenario(num_running=4, running_output_len=40, long_prompt_len=200)
    sim = _sim(scenario)
    trace = Engine(ContinuousBatcher(max_num_seqs=8, max_batched_tokens=36), sim).run(
        _stalled(scenario, sim))
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
    sim = _sim(scenario)
    sweep = budget_sweep(sim, _stalled(scenario, sim), [None, 20, 68], max_num_seqs=8,
                         long_id=scenario.long_id)
    assert sweep["max_batched_tokens"].tolist() == [2048, 20, 68]
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
    with pytest.raises(ValueError, match="target_ratio=1"):
        long_prompt_len_for(cost, 4, target_ratio=1)


def test_plot_token_gaps_draws_the_prefill_window():
    scenario = StallScenario(num_running=2, running_output_len=10, long_prompt_len=50)
    sim = _sim(scenario)
    trace = Engine(ContinuousBatcher(max_num_seqs=4), sim).run(_stalled(scenario, sim))
    ax = plot_token_gaps(trace, scenario.long_id, title="t")
    labels = ax.get_legend_handles_labels()[1]
    assert "long000 prefill" in labels and "long000 arrives" in labels
    assert ax.get_ylabel() == "gap since previous token (ms)"
    with pytest.raises(ValueError, match="unit="):
        plot_token_gaps(trace, scenario.long_id, unit="us")
    plt.close("all")


def test_a_newcomer_after_everyone_left_is_reported_not_measured():
    scenario = StallScenario(num_running=2, running_output_len=4, long_prompt_len=30)
    sim = _sim(scenario)
    trace = Engine(ContinuousBatcher(max_num_seqs=4), sim).run(scenario.requests(long_arrival=10.0))
    with pytest.raises(ValueError, match="no other request was decoding"):
        stall_summary(trace, scenario.long_id)
