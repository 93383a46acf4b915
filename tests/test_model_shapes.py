"""Model shapes as data: bytes per token by hand, and against the embedded model's own cache."""

import pytest

from batchlab.model.shapes import ModelShape, load_model_shapes, model_shape


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
        ModelShape("x", 0, 1, 1, "float32", "made up")
    with pytest.raises(ValueError, match=r"dtype='int3'; must be one of \["):
        ModelShape("x", 1, 1, 1, "int3", "made up")
    with pytest.raises(ValueError, match=r"name='GPT-9'; must be one of \["):
        model_shape("GPT-9")
    with pytest.raises(ValueError, match="block_size=0"):
        model_shape("Llama-3-8B").num_blocks(2**30, 0)
