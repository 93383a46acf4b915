"""The roofline cost model: hand-computed steps, the shapes, the device presets, the simulator on a GPU."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from batchlab.sim import SimBackend
from batchlab.steptime.cost_model import CostModel
from batchlab.steptime.roofline import (MODEL_SHAPES, ModelShape, RooflineCostModel, compare_cost_models,
                                        load_device_presets, profile_features)
from batchlab.engine import Engine
from batchlab.plan import ScheduledChunk
from batchlab.schedulers import ContinuousBatcher
from batchlab.workloads import make_workload

# A toy shape small enough to count by hand: per layer q 4x4, k and v 4x2 each, o 4x4, MLP 3 x 4x8
# = 16 + 16 + 16 + 96 = 144 weights; LM head 4x10 = 40: 184 matmul weights.
TOY = ModelShape("toy", num_layers=1, hidden_size=4, num_heads=2, num_kv_heads=1, head_dim=2,
                 intermediate_size=8, vocab_size=10, tie_embeddings=True, source="hand-made for the tests")
# 1000 B/s and 4000 FLOP/s, 2-byte weights, 0.5 s overhead.
TOY_ROOF = RooflineCostModel(TOY, bandwidth_Bps=1000.0, peak_flops=4000.0, dtype_bytes=2, overhead_s=0.5)


def test_toy_shape_counts_by_hand():
    assert TOY.matmul_params == 184
    assert TOY.weight_bytes(2) == 368
    assert TOY.kv_bytes_per_token(2) == 2 * 1 * 1 * 2 * 2          # a key and a value, 1 KV head of 2
    assert TOY.attention_flops_per_pair == 4 * 1 * 2 * 2           # q.k and p.v, 2 heads of 2


def test_memory_bound_decode_step_by_hand():
    # Two decodes at positions 3 and 4: 4 + 5 = 9 pairs. Bytes 368 + 9*8 = 440 -> 0.44 s;
    # FLOPs 2*184*2 + 9*16 = 880 -> 0.22 s. Memory binds: 0.44 + 0.5.
    chunks = [ScheduledChunk("a", 3, 1, True), ScheduledChunk("b", 4, 1, True)]
    assert TOY_ROOF.predict(chunks) == pytest.approx(0.94)
    assert TOY_ROOF.bound(2, 2, 9) == "memory"


def test_compute_bound_prefill_step_by_hand():
    # One 8-token prompt chunk from 0: 36 pairs; its 8 queries share the keys (a tile holds 128),
    # so 36 / 8 = 4.5 keys read. Bytes 368 + 4.5*8 = 404 -> 0.404 s;
    # FLOPs 2*184*8 + 36*16 = 3520 -> 0.88 s. Compute binds: 0.88 + 0.5.
    assert TOY_ROOF.predict([ScheduledChunk("p", 0, 8, True)]) == pytest.approx(1.38)
    assert TOY_ROOF.bound(1, 8, 36) == "compute"
    assert TOY_ROOF.predict([]) == 0.0
    # With a tile of 2 queries: 36 / 2 = 18 keys read, 368 + 144 = 512 bytes -> still compute-bound.
    tiled = RooflineCostModel(TOY, 1000.0, 4000.0, 2, 0.5, query_tile=2)
    assert tiled.keys_read(1, 8, 36) == 18 and tiled.memory_seconds(1, 8, 36) == pytest.approx(0.512)


def test_published_parameter_counts():
    assert MODEL_SHAPES["SmolLM2-135M"].num_params == 134_515_008
    assert MODEL_SHAPES["Llama-3-8B"].num_params == 8_030_261_248     # Meta's stated 8.03B
    for shape in MODEL_SHAPES.values():
        assert shape.source


def test_smollm2_shape_matches_the_loaded_model(lm, weights):
    shape = MODEL_SHAPES["SmolLM2-135M"]
    assert ModelShape.from_llama_config(weights.config, shape.name, shape.source) == shape
    assert sum(p.numel() for p in lm.model.parameters()) == shape.num_params


def test_shape_rejects_bad_sizes():
    with pytest.raises(ValueError, match="num_layers=0"):
        ModelShape("x", 0, 4, 2, 1, 2, 8, 10, True, "s")
    with pytest.raises(ValueError, match="multiple of num_kv_heads=2"):
        ModelShape("x", 1, 4, 3, 2, 2, 8, 10, True, "s")


def test_presets_load_and_are_sane():
    presets = load_device_presets()
    assert set(presets) == {"T4", "L4", "A100", "H100", "H200"}
    for p in presets.values():
        assert "datasheet" in p.source
        assert 100e9 <= p.memory_bandwidth_Bps <= 10e12
        assert 10e12 <= p.peak_flops <= 2e15
    assert presets["H200"].memory_bandwidth_Bps > presets["H100"].memory_bandwidth_Bps
    assert presets["T4"].dtype == "float16"


@pytest.mark.parametrize("change, message", [
    (lambda d: d["devices"]["H100"].update(peak_tflops=-1), "peak_tflops=-1.*'H100'"),
    (lambda d: d["devices"]["L4"].update(memory_bandwidth_GBps="fast"), "memory_bandwidth_GBps='fast'"),
    (lambda d: d["devices"]["T4"].update(dtype="int8"), "dtype='int8'"),
    (lambda d: d["devices"]["A100"].pop("source"), "'A100' lacks \\['source'\\]"),
    (lambda d: d.update(devices={}), "non-empty 'devices'"),
    (lambda d: d["devices"]["H200"]["kernels"].update(like="B200"), "like='B200'; must be a device with fitted"),
    (lambda d: d["devices"]["A100"]["kernels"].update(compute_fraction=2), "compute_fraction=2; must be"),
    (lambda d: d["devices"]["H100"]["kernels"].pop("transition_p"), "lacks \\['transition_p'\\]"),
    (lambda d: d["step_overhead"].update(ms=-1), "step_overhead.ms=-1; must be"),
])
def test_bad_presets_give_clear_errors(tmp_path, change, message):
    from batchlab.steptime.roofline import DEVICE_PRESETS_PATH
    data = json.loads(DEVICE_PRESETS_PATH.read_text())
    change(data)
    path = tmp_path / "presets.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message):
        load_device_presets(path)


def test_gpu_decode_is_memory_bound_until_large_batches():
    roof = RooflineCostModel.for_device("Llama-3-8B", "H100")
    one, sixty_four = roof.predict_features(1, 1, 513), roof.predict_features(64, 64, 64 * 513)
    assert roof.bound(1, 1, 513) == "memory"
    assert sixty_four < 2 * one                      # 64 sequences cost less than two steps of one
    assert roof.bound(1, 512, 512 * 513 // 2) == "compute"   # a 512-token prompt chunk


def test_simulator_runs_a_gpu_preset_end_to_end():
    roof = RooflineCostModel.for_device("Llama-3-8B", "H100", overhead_s=0.004)
    requests = make_workload(40, "chat", scale="full", rate=20.0, seed=3)
    backend = SimBackend(roof, kv_capacity_tokens=200_000)
    trace = Engine(ContinuousBatcher(32, 2048), backend).run(requests)
    df = trace.requests_df()
    assert len(df) == 40 and (df["status"].astype(str).str.contains("finished", case=False)).all()
    steps = trace.steps_df()
    # Every step took what the roofline predicts for it (no noise): at least the weight read.
    floor = roof.shape.weight_bytes(2) / roof.bandwidth_Bps + roof.overhead_s
    assert (steps["duration"] >= floor * (1 - 1e-9)).all()
    for s in trace.steps[:50]:
        assert s.duration == pytest.approx(roof.predict(s))


def test_fit_recovers_overhead_and_compare_prefers_the_true_form():
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(120):
        if rng.random() < 0.5:
            b = int(rng.integers(1, 64)); ctx = int(rng.integers(1, 2000))
            rows.append((b, b, b * ctx))
        else:
            n = int(rng.integers(16, 1024)); rows.append((1, n, n * (n + 1) // 2))
    table = pd.DataFrame(rows, columns=["num_seqs", "num_tokens", "attention_pairs"])
    truth = RooflineCostModel.for_device("Llama-3-8B", "A100", overhead_s=0.003)
    table["duration"] = truth.predict_df(table) * np.exp(0.02 * rng.standard_normal(len(table)))
    bare = RooflineCostModel.for_device("Llama-3-8B", "A100")
    assert bare.fit(table).overhead_s == pytest.approx(0.003, rel=0.2)
    result = compare_cost_models(table, bare, seed=1)
    assert result["winner"] == "roofline" and result["ratio"] > 1
    assert isinstance(result["additive"], CostModel)
    assert set(result["errors"].index) == {"additive", "roofline"}


def test_profile_rows_become_steps():
    profile = pd.DataFrame([
        {"kind": "decode", "batch_size": 4, "num_tokens": 4, "context_len": 63, "ms_per_step": 20.0},
        {"kind": "prefill", "batch_size": 1, "num_tokens": 16, "context_len": 0, "ms_per_step": 30.0}])
    table = profile_features(profile)
    assert table.values.tolist() == [[4, 4, 256, 0.02], [1, 16, 136, 0.03]]


def test_round_trip_and_bad_arguments():
    again = RooflineCostModel.from_dict(json.loads(json.dumps(TOY_ROOF.to_dict())))
    assert again == TOY_ROOF and again.predict_features(2, 2, 9) == pytest.approx(0.94)
    with pytest.raises(ValueError, match="overhead_s=-1"):
        RooflineCostModel(TOY, 1.0, 1.0, 2, overhead_s=-1)
    with pytest.raises(ValueError, match="shape="):
        RooflineCostModel("toy", 1.0, 1.0, 2)
    with pytest.raises(ValueError, match="cost_model="):
        SimBackend(object(), kv_capacity_tokens=10)
