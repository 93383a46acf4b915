"""batchlab.predict: a vLLM deployment's memory, step and serving, and its bad input."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from batchlab.steptime.collectives import all_reduce_model
from batchlab.predict import Deployment, EngineArgs, TrafficSpec, predict, read_trace
from batchlab.predict.__main__ import main as cli
from batchlab.engine_args import padded_tokens
from batchlab.vllm_sim.vllm_data import ENGINE_DATA
from batchlab.vllm_sim.memory import GIB
from batchlab.predict.traffic import Traffic

ROOT = Path(__file__).resolve().parents[1]
FLAGS = EngineArgs(max_num_seqs=128, max_num_batched_tokens=2048, max_model_len=4096)


def test_vllm_defaults_depend_on_the_device_as_vllm_sets_them():
    h100 = Deployment("Llama-3-8B", "H100").resolved_args
    a100 = Deployment("Llama-3-8B", "A100").resolved_args
    assert (h100.max_num_seqs, h100.max_num_batched_tokens, h100.max_model_len) == (1024, 8192, 8192)
    assert (a100.max_num_seqs, a100.max_num_batched_tokens) == (256, 2048)
    assert h100.dtype == "bfloat16" and Deployment("Llama-2-7B", "H100").resolved_args.dtype == "float16"


def test_cuda_graph_sizes_and_padding_follow_vllm_s_rule():
    sizes = Deployment("Llama-2-7B", "H100", args=FLAGS).resolved_args.cuda_graph_sizes()
    assert sizes[:4] == (1, 2, 4, 8) and sizes[-1] == 256 and 248 in sizes and 264 not in sizes   # min(128*2, 512)
    assert padded_tokens(37, sizes) == 40 and padded_tokens(40, sizes) == 40 and padded_tokens(300, sizes) == 300
    assert EngineArgs(enforce_eager=True).cuda_graph_sizes() == ()
    step = Deployment("Llama-2-7B", "H100", args=FLAGS).step_model
    # the GEMMs run the padded 40 rows; attention runs for the 37 real sequences
    assert step.gpu_seconds(37, 37, 37 * 500) == pytest.approx(step.gpu_seconds(40, 40, 37 * 500), rel=0.01)
    assert step.gpu_seconds(41, 41, 41 * 500) > step.gpu_seconds(40, 40, 40 * 500)


def test_the_kv_cache_matches_vllm_s_logged_memory_profile():
    # vLLM PR #10511's log: Meta-Llama-3-8B on an H100, utilization 0.9: available_kv_cache_memory 53.29 GiB.
    flags = EngineArgs(max_num_seqs=256, max_num_batched_tokens=8192)
    plan = Deployment("Llama-3-8B", "H100", args=flags).memory
    assert plan.weights / GIB == pytest.approx(14.96, abs=0.01)
    assert plan.kv_bytes / GIB == pytest.approx(53.29, rel=0.01)
    assert plan.num_blocks == int(plan.kv_bytes // (16 * 131072))
    tp2 = Deployment("Llama-3-8B", "H100", 2, args=flags).memory
    assert tp2.num_blocks > 2 * plan.num_blocks * 0.98     # half the weights and half the KV per token each


def test_tensor_parallel_splits_the_step_and_pays_for_all_reduces():
    one = Deployment("CodeLlama-34B", "H100", 1, args=FLAGS).step_model.gpu
    two = Deployment("CodeLlama-34B", "H100", 2, args=FLAGS).step_model.gpu
    assert two.all_reduce_seconds(40) > 0 == one.all_reduce_seconds(40)
    assert 0.5 * one.layers_seconds(40) < two.layers_seconds(40) < 0.75 * one.layers_seconds(40)
    model = all_reduce_model("H100", 4)
    assert model(64 * 2**20) > model(2**20) > model(2048) > 0


def test_the_all_reduce_and_cpu_fits_reproduce_from_the_shipped_data():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "fit_all_reduce.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for line in done.stdout.splitlines():
        assert float(line.split("median error ")[1].split("%")[0]) < 15, line
    table = pd.read_csv(ROOT / "data" / "vllm_engine" / "a100_cpu_overheads.csv")
    rows = table[(table["model_name"] == "meta-llama/Llama-2-7b-hf") & (table["tensor_parallel_degree"] == 1)]
    slope, intercept = np.polyfit(rows["batch_size"], rows["SCHEDULE_MEDIAN"] + rows["PREPARE_INPUTS_E2E_MEDIAN"], 1)
    assert ENGINE_DATA["cpu_per_step"]["fixed_ms"] == pytest.approx(intercept, abs=5e-4)
    assert ENGINE_DATA["cpu_per_step"]["per_seq_ms"] == pytest.approx(slope, abs=5e-5)


def test_light_load_keeps_up_and_overload_is_called_saturated():
    deployment = Deployment("Llama-2-7B", "H100", args=FLAGS)
    light = predict(deployment, TrafficSpec(600, 5.0, input_len=500, output_len=200).generate())
    heavy = predict(deployment, TrafficSpec(3000, 60.0, input_len=500, output_len=200).generate())
    assert not light.saturation()["saturated"] and heavy.saturation()["saturated"]
    r = light.bench_result()
    assert r["completed"] == 600 and r["request_throughput"] == pytest.approx(5.0, rel=0.15)
    assert 0 < r["median_ttft_ms"] < 200 and 2 < r["median_tpot_ms"] < 50 and r["p99_e2el_ms"] > r["median_e2el_ms"]
    assert heavy.bench_result()["median_ttft_ms"] > 10 * r["median_ttft_ms"]
    burst = predict(deployment, TrafficSpec(50, input_len=500, output_len=20).generate())     # all at t = 0
    assert burst.saturation()["saturated"] is None and "every request arrived at once" in burst.summary_lines()[-1]
    two = predict(Deployment("Llama-2-7B", "H100", data_parallel_size=2, args=FLAGS),
                  TrafficSpec(3000, 60.0, input_len=500, output_len=200).generate())
    assert two.bench_result()["median_ttft_ms"] < heavy.bench_result()["median_ttft_ms"]


def test_a_trace_file_replays_like_the_same_generated_traffic(tmp_path):
    traffic = TrafficSpec(200, 4.0, input_len=300, output_len=50, prefix_len=64, num_prefix_groups=3).generate()
    rows = pd.DataFrame({"arrival_s": traffic.arrival_s, "input_tokens": traffic.input_tokens,
                         "output_tokens": traffic.output_tokens, "prefix_group": traffic.prefix_group,
                         "prefix_len": traffic.prefix_len})
    rows.to_csv(tmp_path / "t.csv", index=False)
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in rows.to_dict("records")))
    deployment = Deployment("Llama-3-8B", "H100")
    expected = predict(deployment, traffic).bench_result()["median_e2el_ms"]
    for name in ("t.csv", "t.jsonl"):
        replay = read_trace(tmp_path / name)
        assert isinstance(replay, Traffic) and len(replay) == 200
        assert predict(deployment, replay).bench_result()["median_e2el_ms"] == pytest.approx(expected)


@pytest.mark.parametrize("text, message", [
    ("arrival_s,input_tokens\n0,5\n", r"header=.*lacks \['output_tokens'\]"),
    ("arrival_s,input_tokens,output_tokens\n0,5,4\n1,abc,4\n", r"t.csv row 3: input_tokens='abc'; must be an int >= 1"),
    ("arrival_s,input_tokens,output_tokens\n-1,5,4\n", r"row 2: arrival_s=-1.0|row 2: arrival_s='-1'"),
    ("arrival_s,input_tokens,output_tokens,prefix_len\n0,5,4,3\n", r"row 2: prefix_group.*needs the group"),
])
def test_a_bad_trace_row_is_named_by_row_and_field(tmp_path, text, message):
    (tmp_path / "t.csv").write_text(text)
    with pytest.raises(ValueError, match=message):
        read_trace(tmp_path / "t.csv")


def test_bad_deployments_are_refused_in_one_line_each(tmp_path, capsys):
    moe = tmp_path / "config.json"
    moe.write_text(json.dumps({"architectures": ["MixtralForCausalLM"], "num_local_experts": 8}))
    cases = [(["--model", "GPT-5"], "model: shape='GPT-5'"), (["--model", str(moe)], "an MoE config names"),
             (["--enable-expert-parallel"], "enable_expert_parallel=True; must be False for a dense model"),
             (["--vllm-version", "latest"], "vllm_version='latest'; must be a version such as 0.24.0"),
             (["--gpu", "B200"], "gpu='B200'"), (["-tp", "3"], "tensor_parallel=3; must divide"),
             (["--model", "Llama-2-70B"], r"weights=128.5 GiB per GPU.*--tensor-parallel-size 2 fits"),
             (["--gpu", "L4", "-tp", "2"], "needs a measured all-reduce"),
             (["--gpu", "L4", "--gpu-memory-utilization", "0.75"], r"max_model_len=8192; must fit in the KV cache"),
             (["--model", "Llama-2-7B", "--max-model-len", "8192"], r"max_model_len=8192; must be <= 4096"),
             (["--max-num-seqs", "0"], "max_num_seqs=0"), (["--trace", str(tmp_path / "none.csv")], "trace=")]
    for extra, message in cases:
        argv = ["--model", "Llama-3-8B", "--gpu", "H100", "--num-prompts", "5"] + extra
        assert cli(argv) == 2, extra
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and re.search(message, err), (extra, err)


@pytest.mark.parametrize("argv, message", [
    (["--model", "Llama-3-8B", "--gpu", "H100", "--max-num-seqz", "8"], "unrecognized arguments: --max-num-seqz 8"),
    (["--model", "Llama-3-8B", "--gpu", "H100", "--dtype", "int4"], "argument --dtype: invalid choice: 'int4'"),
    (["--gpu", "H100"], "the following arguments are required: --model"),
])
def test_an_unknown_or_malformed_flag_is_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        cli(argv)
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and message in err, err


def test_any_dense_config_json_is_a_model(tmp_path, capsys):
    config = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
              "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "vocab_size": 152064,
              "max_position_embeddings": 32768, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert cli(["--model", str(tmp_path / "config.json"), "--gpu", "H100", "-tp", "2", "--num-prompts", "50",
                "--request-rate", "5", "--max-model-len", "8192"]) == 0
    assert "on 1 x 2 H100" in capsys.readouterr().out
    assert cli(["--model", str(tmp_path / "config.json"), "--gpu", "H100", "-tp", "8"]) == 2     # 28 heads
    assert "tensor_parallel=8; must divide num_heads=28" in capsys.readouterr().err


def test_the_command_line_writes_vllm_bench_serve_s_keys(tmp_path, capsys):
    out = tmp_path / "result.json"
    assert cli(["--model", "Llama-2-70B", "--gpu", "H100", "-tp", "4", "--num-prompts", "300", "--request-rate", "4",
                "--input-len", "500", "--output-len", "100", "--prefix-len", "100", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "blocks of 16 tokens" in text and "verdict: keeps up" in text
    result = json.loads(out.read_text())
    for key in ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_itl_ms", "median_e2el_ms", "p99_e2el_ms",
                "request_throughput", "output_throughput", "completed", "duration"):
        assert math.isfinite(result[key]), key
    assert result["completed"] == 300


def test_async_scheduling_admits_a_newcomer_one_step_later():
    flags = dict(max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=4096)
    traffic = TrafficSpec(400, 6.0, input_len=500, output_len=200, seed=3).generate()
    on = predict(Deployment("Llama-2-7B", "H100", args=EngineArgs(**flags)), traffic).bench_result()
    off = predict(Deployment("Llama-2-7B", "H100", args=EngineArgs(**flags, async_scheduling=False)),
                  traffic).bench_result()
    # Later by about one decode step (a few ms at this load), and never earlier; a lone request is not delayed.
    assert 0.5 * off["median_tpot_ms"] < on["median_ttft_ms"] - off["median_ttft_ms"] < 2 * off["median_tpot_ms"]
    lone = TrafficSpec(1, input_len=500, output_len=20).generate()
    assert predict(Deployment("Llama-2-7B", "H100", args=EngineArgs(**flags)), lone).bench_result()[
        "median_ttft_ms"] == pytest.approx(predict(Deployment("Llama-2-7B", "H100", args=EngineArgs(
            **flags, async_scheduling=False)), lone).bench_result()["median_ttft_ms"], rel=0.2)


def test_small_all_reduces_are_priced_by_vllm_s_own_kernel_on_h100s():
    model = all_reduce_model("H100", 4)
    assert model(393_216) < 0.5 * model.nccl_seconds(393_216)        # a 24-token decode of a 70B layer
    assert model(16 * 2**20) == pytest.approx(model.nccl_seconds(16 * 2**20))
    a100 = all_reduce_model("A100", 4)
    assert a100(393_216) == pytest.approx(a100.nccl_seconds(393_216))   # no published custom times: NCCL


def test_the_check_script_scores_measured_runs(tmp_path):
    """A stage 'measured' as the predictor predicts it scores 0%; a stage 30% slower scores 30%."""
    deployment = Deployment("Llama-2-7B", "H100", args=FLAGS)
    spec = TrafficSpec(300, 5.0, arrival="constant", input_len=400, output_len=101, prefix_len=100)
    r = predict(deployment, spec.generate()).bench_result()
    run = {"model": "meta-llama/Llama-2-7b-hf", "tensor_parallel": 1, "flags": {"max_num_seqs": 128,
           "max_num_batched_tokens": 2048, "max_model_len": 4096},
           "workload": {"rate_rps": 5.0, "arrival": "constant", "num_requests": 300, "input_tokens": {"p50": 500},
                        "output_tokens": {"p50": 101}, "prefix_tokens": 100},
           "measured": {"ttft_ms": {"p50": r["median_ttft_ms"]}, "e2e_ms": {"p50": r["median_e2el_ms"]}}}
    slow = {**run, "measured": {k: {"p50": v["p50"] * 1.3} for k, v in run["measured"].items()}}
    script = [sys.executable, str(ROOT / "scripts" / "check_predictor.py")]
    for measured, expected in ((run, 0.0), (slow, 0.3)):
        (tmp_path / "runs.jsonl").write_text(json.dumps(measured) + "\n")
        done = subprocess.run(script + [str(tmp_path / "runs.jsonl")], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        median = float(done.stdout.splitlines()[-1].split("keep up: ")[1].split("%")[0]) / 100
        assert abs(median - expected / (1 + expected)) < 0.02, done.stdout    # predicted/measured - 1
    (tmp_path / "bad.jsonl").write_text('{"model": "x"}\n')
    done = subprocess.run(script + [str(tmp_path / "bad.jsonl")], capture_output=True, text=True)
    assert done.returncode == 2 and "bad.jsonl line 1: KeyError" in done.stderr


def _inference_sim_layout(root: Path, multi_turn: bool) -> None:
    """One run of inference-sim's layout: 2 system prompts x 3 questions, one stage at 5 requests/s."""
    import yaml
    run = root / "default_args" / "run-1"
    (run / "results").mkdir(parents=True)
    (run / "exp-config.yaml").write_text(yaml.safe_dump({
        "model": "meta-llama/Llama-2-7b-hf", "tensor_parallelism": 1, "max_model_len": 4096,
        "max_num_batched_tokens": 2048, "max_num_seqs": 128}))
    shared = {"num_groups": 2, "num_prompts_per_group": 3, "system_prompt_len": 100, "question_len": 400,
              "output_len": 50, **({"enable_multi_turn_chat": True} if multi_turn else {})}
    (run / "results" / "config.yaml").write_text(yaml.safe_dump({
        "data": {"type": "shared_prefix", "shared_prefix": shared},
        "load": {"type": "constant", "stages": [{"rate": 5.0, "duration": 30}]}}))
    (run / "results" / "stage_0_lifecycle_metrics.json").write_text(json.dumps({"successes": {
        "prompt_len": {"median": 500}, "output_len": {"median": 50},
        "latency": {"time_to_first_token": {"median": 0.03}, "request_latency": {"median": 0.5}}}}))


def test_the_check_script_sends_inference_perfs_prompts_in_turn_as_it_did(tmp_path):
    """inference-perf's shared-prefix client makes groups x questions prompts once and sends them in
    turn, so each one comes back verbatim: the stage carries that pool, and its prediction finds
    every repeated prompt in the prefix cache (a shorter TTFT than fresh prompts of the same length)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("check_predictor", ROOT / "scripts" / "check_predictor.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    _inference_sim_layout(tmp_path / "single", multi_turn=False)
    _inference_sim_layout(tmp_path / "chat", multi_turn=True)
    (run,) = check.inference_sim_runs(tmp_path / "single")
    assert run["workload"]["prompt_pool"] == 6
    assert check.inference_sim_runs(tmp_path / "chat")[0]["workload"]["prompt_pool"] is None   # turns grow
    pooled = check.stage_prediction(run, "H100", None)["predicted"]
    fresh = check.stage_prediction({**run, "workload": {**run["workload"], "prompt_pool": None}}, "H100", None)
    assert pooled["ttft"] < 0.9 * fresh["predicted"]["ttft"], (pooled, fresh["predicted"])   # 0.80 here
