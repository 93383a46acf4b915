"""bf16 weights on a CPU without bf16 matrix units: ``forward_step`` computes each product in fp32,
through an fp32 copy of the weight made once (``LlamaWeights.widen_bf16``). The weights stay bf16;
the logits are those of widening each weight at its product, and close to fp32's."""

import torch

from batchlab.model import load_model
from batchlab.model.cpu_dtype import cpu_bf16_flags
from batchlab.model.cpu_products import StepProducts
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


def test_the_fp32_copies_give_the_bits_of_widening_each_weight_at_its_product(monkeypatch):
    w16 = LlamaWeights.from_hf(load_model(device="cpu", dtype="bfloat16").model)
    w16.widen_bf16 = True
    assert set(w16.products.widened) == {id(w) for w in w16.products.weights}
    assert all(c.dtype == torch.float32 and torch.equal(c, w.float())
               for w in w16.products.weights for c in [w16.products.widened[id(w)]])
    prompts = [[1, 504, 3458, 282, 4649, 314], [1, 504, 1], [1, 2, 3, 4]]   # rows of 6, 3 and 4 tokens

    def run():
        cache = w16.new_kv_cache(len(prompts), 32)
        return forward_step(w16, cache, [SeqChunk(i, 0, p, True) for i, p in enumerate(prompts)])

    copies = run()
    monkeypatch.setattr(StepProducts, "__call__", lambda self, x, w: (x.float() @ w.float()).to(x.dtype))
    assert torch.equal(run(), copies)
    w16.widen_bf16 = False
    assert w16.products.widened == {}
