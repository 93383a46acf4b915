"""bf16 weights on a CPU without bf16 matrix units: ``forward_step`` widens each weight to fp32 for
its product (``LlamaWeights.widen_bf16``). The weights stay bf16; the logits stay close to fp32's."""

import torch

from batchlab.model import load_model
from batchlab.model.cpu_dtype import cpu_bf16_flags
from batchlab.model.llama import LlamaWeights, SeqChunk, forward_step


def _logits(weights, prompt):
    cache = weights.new_kv_cache(1, 32)
    return forward_step(weights, cache, [SeqChunk(0, 0, prompt, True)])[0].float()


def test_widened_bf16_step_keeps_bf16_weights_and_fp32_like_logits(lm):
    prompt = lm.tokenizer("The capital of France is")["input_ids"]
    w32 = LlamaWeights.from_hf(lm.model)
    w16 = LlamaWeights.from_hf(load_model(device="cpu", dtype="bfloat16").model)
    assert not w32.widen_bf16
    assert w16.widen_bf16 == (not cpu_bf16_flags())
    assert all(t.dtype == torch.bfloat16 for t in (w16.lm_head, w16.layers[0].w_qkv, w16.layers[0].w_down))
    ref = _logits(w32, prompt)
    for widen in (True, False):        # both paths, whatever this CPU would pick
        w16.widen_bf16 = widen
        got = _logits(w16, prompt)
        assert got.argmax() == ref.argmax(), widen
        # bf16 weights: a few hundredths of the logits' spread, never more than a tenth
        assert (got - ref).abs().max() < 0.1 * (ref.max() - ref.min()), widen
