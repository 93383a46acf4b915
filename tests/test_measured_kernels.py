"""batchlab.steptime.measured_kernels and measured_step: vLLM's kernels as AIConfigurator measured them."""

import json

import numpy as np
import pytest

from batchlab.steptime.measured_kernels import KernelTables, read_table
from batchlab.plan import ScheduledChunk, decode_split
from batchlab.predict import Deployment, EngineArgs, TrafficSpec, predict
from batchlab.shapes import ModelShape

MIXTRAL = {"architectures": ["MixtralForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
           "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 32768,
           "torch_dtype": "bfloat16"}


@pytest.fixture(scope="module")
def h100():
    return KernelTables.load("H100")


def test_a_measured_gemm_is_read_back_and_others_lie_between_neighbours(h100):
    rows = read_table("h100_sxm", "gemm", h100.versions["gemm"], "gemm")
    row = rows[(rows.gemm_dtype == "bfloat16") & (rows.m == 64) & (rows.n == 4096) & (rows.k == 4096)].iloc[0]
    assert h100.gemm_seconds(64, 4096, 4096) == pytest.approx(row.latency * 1e-3, rel=1e-9)
    assert h100.gemm.distance(64, 4096, 4096) == 1.0
    between = h100.gemm_seconds(64, 4096, 4608)            # k between 4096 and 5120
    assert h100.gemm_seconds(64, 4096, 4096) < between < h100.gemm_seconds(64, 4096, 5120)
    # past the largest measured n, in proportion to the work
    edge = h100.gemm_seconds(8, 65536, 4096)
    assert h100.gemm_seconds(8, 131072, 4096) == pytest.approx(2 * edge)


def test_attention_fits_its_measured_kernels_and_reads_the_kv_cache(h100):
    fit = h100.attention(32, 8, 128)
    assert fit.median_error["decode"] < 0.12 and fit.median_error["prefill"] < 0.12, fit.median_error
    short, long = fit.seconds(64, 64, 64 * 500, 64, 64 * 500), fit.seconds(64, 64, 64 * 4000, 64, 64 * 4000)
    kv_bytes = 64 * 3500 * 2 * 8 * 128 * 2                                  # the extra keys and values read
    assert 1.5e12 < kv_bytes / (long - short) < 3.35e12                    # under the H100's 3.35 TB/s
    # a prompt chunk after a cached prefix costs less than the same pairs read as decodes would
    mixed = fit.seconds(2, 513, 512 * 1000 + 512 * 513 // 2 + 800, 1, 800)
    assert mixed < fit.seconds(1, 1, 512 * 1000, 1, 512 * 1000)


def test_decode_split_counts_the_one_token_chunks():
    chunks = [ScheduledChunk("a", 100, 1, True), ScheduledChunk("b", 0, 50, True), ScheduledChunk("c", 9, 1, True)]
    assert decode_split(chunks) == (2, 101 + 10)


def test_graph_all_reduces_are_cheaper_than_eager_ones_when_small(h100):
    small = 16 * 8192 * 2
    assert h100.all_reduce_seconds(small, 4, graph=True) < 0.5 * h100.all_reduce_seconds(small, 4, graph=False)
    assert h100.all_reduce_seconds(2 * small, 2, True) >= h100.all_reduce_seconds(small, 2, True)
    with pytest.raises(ValueError, match=r"tensor_parallel_size=3; must be one of \[2, 4, 8\]"):
        h100.all_reduce_seconds(small, 3, True)


def test_a_step_beyond_the_captured_graphs_pays_the_eager_all_reduce():
    d = Deployment("Llama-3-8B", "H100", 2, args=EngineArgs(max_num_seqs=128))
    step = d.step_model.gpu
    assert step.largest_graph == 256
    assert step.all_reduce_seconds(257) > 1.1 * step.all_reduce_seconds(256)
    eager = Deployment("Llama-3-8B", "H100", 2, args=EngineArgs(max_num_seqs=128, enforce_eager=True))
    assert eager.step_model.gpu.all_reduce_seconds(8) > 2 * step.all_reduce_seconds(8)


def test_a_mixture_of_experts_is_priced_from_its_measured_moe_layer(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MIXTRAL))
    d = Deployment(str(tmp_path / "config.json"), "H100", 2, args=EngineArgs(128, 2048, max_model_len=4096))
    assert d.memory.weights / 2**30 == pytest.approx(46.7e9 * 2 / 2 / 2**30, rel=0.02)
    step = d.step_model
    # a decode step reads nearly every expert already at batch 16: far above 2 of 8 experts' weights
    one, sixteen = step.gpu_seconds(1, 1, 500), step.gpu_seconds(16, 16, 16 * 500)
    assert 1.2 * one < sixteen
    r = predict(d, TrafficSpec(40, 2.0, input_len=500, output_len=50).generate()).bench_result()
    assert r["completed"] == 40 and 5 < r["median_tpot_ms"] < 60
    ep = Deployment(str(tmp_path / "config.json"), "H100", 2, args=EngineArgs(128, 2048, max_model_len=4096,
                                                                                enable_expert_parallel=True))
    assert ep.step_model.gpu_seconds(8, 8, 4000) != pytest.approx(step.gpu_seconds(8, 8, 4000))


def test_an_unmeasured_moe_shape_is_refused_naming_the_measured_ones(tmp_path):
    odd = {**MIXTRAL, "num_local_experts": 6}
    (tmp_path / "config.json").write_text(json.dumps(odd))
    with pytest.raises(ValueError, match=r"moe shape=\(4096, 14336, 2, 6, 2, 1\); must be .*measured MoE layer"):
        Deployment(str(tmp_path / "config.json"), "H100", 2, args=EngineArgs(128, 2048, max_model_len=4096))


def test_kv_heads_are_replicated_when_the_gpus_outnumber_them():
    config = {**MIXTRAL, "architectures": ["LlamaForCausalLM"], "num_key_value_heads": 2}
    for key in ("num_local_experts", "num_experts_per_tok"):
        config.pop(key)
    shape = ModelShape.from_config(config, "two-kv", "test")
    assert shape.layer.kv_heads_per_gpu(4) == 1 and shape.kv_bytes_per_token(2, 4) == 2 * 32 * 1 * 128 * 2
    d = Deployment(shape, "H100", 4, args=EngineArgs(max_model_len=4096))
    assert d.memory.kv_bytes_per_block == 16 * shape.kv_bytes_per_token(2, 4)


def test_gpus_without_measurements_fall_back_to_the_labelled_roofline():
    d = Deployment("Llama-2-7B", "L4", args=EngineArgs(max_model_len=2048))
    assert "ROOFLINE-BASED ESTIMATE" in d.kernel_source
    assert "measured vLLM kernels on h100_sxm" in Deployment("Llama-2-7B", "H100").kernel_source
    with pytest.raises(ValueError, match=r"gpu='L4'; must be one of \['A100', 'H100', 'H200'\]"):
        Deployment("Llama-2-7B", "L4", args=EngineArgs(max_model_len=2048), vllm_version="0.24.0")


def test_a_vllm_version_picks_the_nearest_measured_tables():
    old = KernelTables.load("H100", "0.15.1")
    assert old.versions["all_reduce"] == "0.14.0" and old.versions["gemm"] == "0.24.0"
    assert "WARNING: none measured at 0.15.1" in old.describe("0.15.1")
    assert "WARNING" not in KernelTables.load("H100").describe()
    assert np.isfinite(KernelTables.load("A100").gemm_seconds(100, 4096, 4096))


def test_the_roofline_refuses_experts_and_the_shapes_table_holds_mixtral():
    from batchlab.steptime.roofline import MODEL_SHAPES, RooflineCostModel

    mixtral = MODEL_SHAPES["Mixtral-8x7B"]
    assert mixtral.num_params == pytest.approx(46.7e9, rel=0.005) and mixtral.moe.experts_per_token == 2
    with pytest.raises(ValueError, match="shape='Mixtral-8x7B'; must be a dense model"):
        RooflineCostModel(mixtral, 3.35e12, 989e12, 2)


def test_the_2024_profiles_cross_check_the_measured_gemms_op_by_op(h100):
    from batchlab.steptime.kernel_profiles import KERNEL_PROFILES_DIR, compare_projections, read_kernel_profile

    profile = read_kernel_profile(KERNEL_PROFILES_DIR / "h100_Llama-2-7b-hf.csv")
    compared = compare_projections(profile, h100.gemm_seconds)
    assert len(compared) == 4 * len(profile[profile["num_tokens"] <= 4096])
    one = compared[(compared.tensor_parallel == 2) & (compared.num_tokens == 1) & (compared.op == "mlp_up_proj")].iloc[0]
    assert one.predicted_ms == pytest.approx(h100.gemm_seconds(1, 11008, 4096) * 1e3)     # gate and up of 1/2
    row = profile[(profile.tensor_parallel == 2) & (profile.num_tokens == 1)].iloc[0]
    assert one.measured_ms == row["mlp_up_proj_ms"]


def test_a_step_known_by_its_totals_is_split_as_vllm_builds_one():
    from batchlab.steptime.attention_fit import guess_split
    assert guess_split(8, 8, 800) == (8, 800)                       # all decodes
    assert guess_split(1, 512, 512 * 1024) == (0, 0)                # one chunk, its cached prefix its own
    assert guess_split(3, 102, 2 * 50 + 100 * 101 // 2) == (2, 100)  # two decodes and a fresh prompt
