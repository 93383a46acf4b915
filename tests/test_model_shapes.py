"""Model shapes as data: bytes per token by hand, and against the embedded model's own cache."""

import dataclasses
import json

import pytest

from batchlab.shapes import ModelShape, load_model_shapes, model_shape


def test_shapes_have_sources_and_bytes_per_token_worked_out_by_hand():
    shapes = load_model_shapes()
    assert {"SmolLM2-135M", "Llama-3-8B"} <= set(shapes)
    assert all(s.source for s in shapes.values())
    llama = shapes["Llama-3-8B"]
    assert llama.bytes_per_token == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    assert llama.kv_tokens(2**30) == 8192 and llama.max_concurrency(2**30, 2048) == 4
    assert llama.max_concurrency(2**30, 2049) == 3          # 129 blocks each, 512 in the budget
    assert shapes["SmolLM2-135M"].bytes_per_token == 2 * 30 * 3 * 64 * 4


def test_smollm2_shape_matches_the_embedded_model_and_its_cache(lm, weights):
    shape = model_shape("SmolLM2-135M")
    cfg = lm.model.config
    assert (shape.num_layers, shape.num_kv_heads) == (cfg.num_hidden_layers, cfg.num_key_value_heads)
    assert shape.head_dim == cfg.hidden_size // cfg.num_attention_heads
    assert shape.bytes_per_token == weights.new_paged_kv_cache(4).bytes_per_token


def test_bad_shapes_and_names_are_refused():
    with pytest.raises(ValueError, match=r"num_layers=0; must be an int >= 1 \(model shape 'x'\)"):
        ModelShape("x", 0, 8, 1, 1, 8, 16, 32, True, "made up", "float32")
    with pytest.raises(ValueError, match=r"dtype='int3'; must be one of \["):
        ModelShape("x", 1, 8, 1, 1, 8, 16, 32, True, "made up", "int3")
    with pytest.raises(ValueError, match=r"shape='GPT-9'; must be one of \["):
        model_shape("GPT-9")
    with pytest.raises(ValueError, match="block_size=0"):
        model_shape("Llama-3-8B").num_blocks(2**30, 0)


LLAMA3_CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
                 "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
                 "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                 "max_position_embeddings": 8192}


def test_a_config_json_reads_as_the_table_s_shape(tmp_path):
    path = tmp_path / "Meta-Llama-3-8B" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(LLAMA3_CONFIG))
    shape = model_shape(str(path))
    table = model_shape("Llama-3-8B")
    assert shape.name == "Meta-Llama-3-8B" and str(path) in shape.source
    assert dataclasses.replace(shape, name=table.name, source=table.source) == table
    assert shape.num_params == 8_030_261_248
    mha = ModelShape.from_config({**LLAMA3_CONFIG, "num_key_value_heads": None, "torch_dtype": None}, "mha", "test")
    assert (mha.num_kv_heads, mha.head_dim, mha.dtype) == (32, 128, "bfloat16")
    qwen = ModelShape.from_config({**LLAMA3_CONFIG, "architectures": ["Qwen2ForCausalLM"], "head_dim": 64}, "q", "t")
    assert qwen.head_dim == 64 and qwen.kv_bytes_per_token(2) == 2 * 32 * 8 * 64 * 2


MIXTRAL_CONFIG = {**LLAMA3_CONFIG, "architectures": ["MixtralForCausalLM"], "num_local_experts": 8,
                  "num_experts_per_tok": 2, "intermediate_size": 14336, "vocab_size": 32000, "num_key_value_heads": 8}


def test_a_mixture_of_experts_counts_every_expert_s_weights():
    mixtral = ModelShape.from_config(MIXTRAL_CONFIG, "mixtral", "test")
    assert (mixtral.moe.num_experts, mixtral.moe.experts_per_token, mixtral.moe.intermediate_size) == (8, 2, 14336)
    assert mixtral.num_params == pytest.approx(46.7e9, rel=0.01)          # Mixtral-8x7B's published 46.7B
    qwen = {**LLAMA3_CONFIG, "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 128, "num_experts_per_tok": 8,
            "moe_intermediate_size": 768}
    assert ModelShape.from_config(qwen, "qwen3-moe", "test").moe.intermediate_size == 768


def test_configs_it_cannot_describe_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"mixtral: an MoE config names num_local_experts"):
        ModelShape.from_config({**LLAMA3_CONFIG, "architectures": ["MixtralForCausalLM"]}, "mixtral", "test")
    shared = {**MIXTRAL_CONFIG, "architectures": ["Qwen2MoeForCausalLM"], "shared_expert_intermediate_size": 5632}
    with pytest.raises(ValueError, match=r"shared_expert_intermediate_size=5632; must be 0 or absent.*not priced"):
        ModelShape.from_config(shared, "qwen2-moe", "test")
    with pytest.raises(ValueError, match=r"architectures=\['DeepseekV3ForCausalLM'\].*MLA and other attention"):
        ModelShape.from_config({**LLAMA3_CONFIG, "architectures": ["DeepseekV3ForCausalLM"]}, "dsv3", "test")
    with pytest.raises(ValueError, match=r"architectures=\['FalconForCausalLM'\].*not a Llama-style decoder"):
        ModelShape.from_config({**LLAMA3_CONFIG, "architectures": ["FalconForCausalLM"]}, "falcon", "test")
    with pytest.raises(ValueError, match=r"lacks \['vocab_size'\]"):
        ModelShape.from_config({k: v for k, v in LLAMA3_CONFIG.items() if k != "vocab_size"}, "x", "test")
    with pytest.raises(ValueError, match="not a readable config.json"):
        model_shape(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match=r"tensor_parallel=3; must divide num_heads=32"):
        model_shape("Llama-3-8B").layer.projections(3)
