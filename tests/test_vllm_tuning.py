"""Tuning vLLM: its flags as a checked config, the outside-in calibration, the load predicted on
the simulator, and a /metrics sampler; the parts that need vLLM run it for real (one short server).

vLLM tests follow ``tests/test_vllm_ref.py``: CI sets vLLM up, and there a missing vLLM venv is a
failure; elsewhere they skip with the command that sets it up.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from batchlab.analysis.metrics import latency_values
from batchlab.steptime.cost_model import CostModel
from batchlab.loadgen import LoadRequest, course_tokenizer, plan_requests, prom, run_load
from batchlab.loadgen.calibrate import OutsideInConfig, calibrate_outside_in, fastest_rounds
from batchlab.loadgen.predict import compare, load_figures, simulate_load
from batchlab.engine_args import EngineArgs
from batchlab.launch import COURSE_ARGS, VLLMUnavailable, ensure_running, start_vllm
from batchlab.vllm_sim.flag_table import FLAG_TABLE

COST = CostModel(0.045, 0.0005, 0.0022, 1e-6)
SMALL_CONFIG = OutsideInConfig(prompt_lens=(16, 128), prompt_repeats=2, decode_batches=(1, 4), decode_output_len=16,
                               rounds=1)


@pytest.fixture(scope="module")
def tok():
    return course_tokenizer()


# --- without vLLM --------------------------------------------------------------------------------
def test_flags_write_vllms_command_line_and_leave_defaults_out():
    assert EngineArgs().cli_args() == []
    args = EngineArgs(max_num_seqs=2, max_num_batched_tokens=256, enable_chunked_prefill=False,
                      enable_prefix_caching=False, enforce_eager=False, disable_log_stats=True).cli_args()
    assert args == ["--max-num-seqs", "2", "--max-num-batched-tokens", "256", "--no-enable-chunked-prefill",
                    "--no-enable-prefix-caching", "--disable-log-stats"]
    started = EngineArgs(max_num_seqs=2).with_defaults(COURSE_ARGS).cli_args()   # what start_vllm passes
    assert started == ["--max-num-seqs", "2", "--max-model-len", "1024", "--gpu-memory-utilization", "0.5",
                       "--enforce-eager"]
    assert EngineArgs(enforce_eager=False).with_defaults(COURSE_ARGS).enforce_eager is False   # compiled
    assert set(FLAG_TABLE.columns) == {"batchlab", "vLLM flag", "vLLM V1 default", "SGLang", "earlier notebooks"}


@pytest.mark.parametrize("kwargs, named", [({"max_num_seqs": 0}, "max_num_seqs"),
                                           ({"max_num_batched_tokens": 2.5}, "max_num_batched_tokens"),
                                           ({"enable_prefix_caching": "yes"}, "enable_prefix_caching"),
                                           ({"max_num_seqs": 8, "max_num_batched_tokens": 4},
                                            "max_num_batched_tokens=4"),
                                           ({"dtype": "fp8"}, "dtype")])
def test_bad_flags_raise_naming_the_value(kwargs, named):
    with pytest.raises(ValueError, match=named):
        EngineArgs(**kwargs)


def test_start_vllm_refuses_flags_that_are_not_engine_args():
    with pytest.raises(ValueError, match="must be an EngineArgs"):
        start_vllm({"max_num_seqs": 2})


@pytest.mark.parametrize("kwargs, named", [({"prompt_lens": (16,)}, "prompt_lens"),
                                           ({"decode_batches": (1, 0)}, "decode_batches"),
                                           ({"decode_output_len": 4}, "decode_output_len"),
                                           ({"prompt_repeats": 0}, "prompt_repeats"),
                                           ({"rounds": 0}, "rounds")])
def test_outside_in_config_checks_its_fields(kwargs, named):
    with pytest.raises(ValueError, match=named):
        OutsideInConfig(**kwargs)


def test_each_row_keeps_its_fastest_round():
    def round_of(prefill_s, decode_s):
        return pd.DataFrame([("prefill", 16, 1, 16, 136, prefill_s), ("decode", 4, 4, 4, 228, decode_s)],
                            columns=["kind", "size", "num_seqs", "num_tokens", "attention_pairs", "duration"])
    # A burst of other work slowed the first round's prefill and the second round's decode.
    points = fastest_rounds([round_of(0.09, 0.040), round_of(0.06, 0.050), round_of(0.07, 0.045)])
    assert list(points["kind"]) == ["prefill", "decode"] and list(points["size"]) == [16, 4]
    assert points["duration"].tolist() == [0.06, 0.040]
    assert points["spread"].to_numpy() == pytest.approx([1.5, 1.25])


def test_simulated_load_shows_both_knobs_effects(tok):
    load = plan_requests(16, prompt_len=48, output_len=16, tokenizer=tok, arrival="poisson", rate=6.0)
    small, large = (load_figures(simulate_load(COST, load, EngineArgs(max_num_seqs=k))) for k in (1, 64))
    assert large["output_tok_s"] > 2 * small["output_tok_s"]
    assert small["ttft_p50"] > 5 * large["ttft_p50"]
    assert large["itl_p50"] > small["itl_p50"]               # bigger steps: a slower stream
    shared = list(load[0].prompt) * 6                        # 288 tokens, the same for every request
    one_by_one = [LoadRequest(f"p{i}", shared + [100 + i] * 8, 4, arrival_time=10.0 * i) for i in range(4)]
    off, on = (simulate_load(COST, one_by_one, EngineArgs(enable_prefix_caching=cached, block_size=128)) for cached in (False, True))
    assert np.median(latency_values(on, "ttft")) < 0.6 * np.median(latency_values(off, "ttft"))
    table = compare(on, off)
    assert list(table.columns) == ["predicted", "measured", "error"]


def test_simulate_load_and_load_request_refuse_bad_input():
    with pytest.raises(ValueError, match="cost_model"):
        simulate_load("fast", [LoadRequest("a", [1, 2], 2)])
    with pytest.raises(ValueError, match="token-id prompts"):
        simulate_load(COST, [LoadRequest("a", "some text", 2)])
    with pytest.raises(ValueError, match="extra_body"):
        LoadRequest("a", [1, 2], 2, extra_body=["cache_salt"])
    with pytest.raises(ValueError, match="interval"):
        prom.GaugeSampler("http://127.0.0.1:1", ["vllm:num_requests_running"], interval=0)


def test_run_to_run_file_holds_every_knob_of_notebook_13_from_several_runs():
    """Notebook 13 sets its tolerances from this file before measuring; every run must carry the
    same knobs, each predicted and measured, and the measurements must actually vary."""
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    data = json.loads((root / "data" / "vllm_tuning" / "run_to_run.json").read_text())
    source = (root / "notebooks" / "src" / "13_tuning_vllm.py").read_text()
    knobs = {k for k in re.findall(r'"((?:max_num_seqs|prefix caching|budget) [^"]+)"', source) if ":" in k}
    assert len(data["runs"]) >= 5 and {"cpu", "cores"} <= set(data["machine"])
    for run in data["runs"]:
        assert set(run["ratios"]) == knobs, sorted(set(run["ratios"]) ^ knobs)
        assert all(v["predicted"] > 0 and v["measured"] > 0 for v in run["ratios"].values())
    for knob in knobs:
        assert len({run["ratios"][knob]["measured"] for run in data["runs"]}) > 1, knob


def test_gauge_sampler_says_when_no_scrape_succeeded():
    with prom.GaugeSampler("http://127.0.0.1:9", ["vllm:num_requests_running"], interval=0.05) as sampler:
        pass
    with pytest.raises(RuntimeError, match="no scrape"):
        sampler.frame()


# --- on batchlab's server: the calibration works on any OpenAI-compatible server ---------------------
def test_outside_in_calibration_on_batchlabs_server(tok):
    from batchlab.launch import start_server
    with start_server(max_num_seqs=8, max_model_len=512, threads=1) as server:
        cal = calibrate_outside_in(server.url, tok, SMALL_CONFIG)
    assert list(cal.points["kind"]) == ["prefill", "prefill", "decode", "decode"]
    assert cal.cost_model.per_token_s > 0 or cal.cost_model.per_attention_pair_s > 0
    long_prompt, short_prompt = cal.points["duration"].iloc[1], cal.points["duration"].iloc[0]
    assert long_prompt > short_prompt                        # 128 tokens cost more than 16
    assert cal.median_rel_error < 0.5, cal.points


# --- on vLLM -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vllm(vllm_ready):
    try:
        server = start_vllm(EngineArgs(max_model_len=512, max_num_seqs=2, enable_prefix_caching=False))
    except VLLMUnavailable as e:
        pytest.skip(f"vLLM cannot run on this machine: {e}")
    try:
        yield server
    finally:
        server.stop()


def test_vllm_takes_the_flags_and_its_metrics_show_them(vllm, tok):
    info = prom.scrape(vllm.url).query("family == 'vllm:cache_config_info'")["labels"].iloc[0]
    assert info["enable_prefix_caching"] == "False"
    load = plan_requests(6, prompt_len=32, output_len=24, tokenizer=tok, arrival="at_once", id_prefix="flags-")
    before = prom.scrape(vllm.url)
    with prom.GaugeSampler(vllm.url, ["vllm:num_requests_running", "vllm:num_requests_waiting"], 0.1) as sampler:
        result = run_load(vllm.url, load, max_duration=120)
    after = prom.scrape(vllm.url)
    ensure_running(vllm)
    assert all(r.ok for r in result.records), result.status_counts()
    gauges = sampler.frame()
    assert gauges["vllm:num_requests_running"].max() == 2            # --max-num-seqs 2 holds
    assert gauges["vllm:num_requests_waiting"].max() >= 1            # the rest queued
    assert prom.counter_delta(before, after, "vllm:generation_tokens") == 6 * 24
    assert prom.counter_delta(before, after, "vllm:prefix_cache_hits") == 0
    buckets = prom.histogram_buckets(after, "vllm:time_to_first_token_seconds", since=before)
    assert buckets.iloc[-1] == 6
    low, high = prom.bucket_of(float(np.max(latency_values(result.trace, "ttft"))), buckets)
    assert high > low >= 0


def test_outside_in_calibration_of_vllm(vllm, tok):
    cal = calibrate_outside_in(vllm.url, tok, OutsideInConfig(prompt_lens=(16, 128, 256), prompt_repeats=2,
                                                              decode_batches=(1, 2), decode_output_len=16))
    assert len(cal.points) == 5 and (cal.points["duration"] > 0).all()
    prefill = cal.points[cal.points["kind"] == "prefill"]["duration"].to_numpy()
    assert prefill[2] > 1.5 * prefill[0]                    # 256 tokens against 16: nothing came from a cache
    assert cal.median_rel_error < 0.3, cal.points
