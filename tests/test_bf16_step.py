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


def test_widened_bf16_products_take_fp32s_route_on_fp32_copies_and_round_back():
    w16 = LlamaWeights.from_hf(load_model(device="cpu", dtype="bfloat16").model)
    w16.widen_bf16 = True
    products = w16.products
    assert set(products.widened) == {id(w) for w in products.weights}
    assert all(c.dtype == torch.float32 and torch.equal(c, w.float())
               for w in products.weights for c in [products.widened[id(w)]])
    fp32 = StepProducts([products.widened[id(w)] for w in products.weights], torch.float32, "cpu")
    assert products.min_rows == fp32.min_rows and len(products.packed) == len(fp32.packed)
    torch.manual_seed(0)
    for w in (w16.layers[0].w_qkv, w16.lm_head):
        for rows in (1, 2, 7):                       # fp32's route: plain at one row, packed from two
            x = torch.randn(rows, w.shape[0]).bfloat16()
            got = products(x, w)
            assert got.dtype == torch.bfloat16
            assert torch.equal(got, fp32(x.float(), products.widened[id(w)]).to(torch.bfloat16)), rows
    w16.widen_bf16 = False
    assert products.widened == {} and products.min_rows == 1       # bf16's own route again


def test_decode_attention_in_bf16_widens_exactly_where_the_cpu_has_no_bf16_units(monkeypatch):
    import batchlab.model.step_layout as step_layout
    from batchlab.model.step_layout import decode_attention, grouped_attention

    torch.manual_seed(0)
    S, H, KV, hd, ctx = 4, 9, 3, 64, 40
    q, k, v = (torch.randn(*shape).bfloat16() for shape in ((S, H, 1, hd), (S, KV, ctx, hd), (S, KV, ctx, hd)))
    mask = (torch.arange(ctx)[None, :] < torch.tensor([40, 33, 17, 1])[:, None]).view(S, 1, 1, ctx)
    # by hand: each product in fp32, its result rounded to bf16; softmax in fp32
    scores = (q[:, :, 0].float().reshape(S, KV, H // KV, hd) @ k.float().transpose(-1, -2)).bfloat16().float()
    scores = (scores * hd ** -0.5).masked_fill(~mask.view(S, 1, 1, -1), float("-inf"))
    probs = torch.softmax(scores, dim=-1).bfloat16().float()
    by_hand = (probs @ v.float()).bfloat16().reshape(S, H, hd)
    assert torch.equal(grouped_attention(q[:, :, 0], k, v, mask, widen=True), by_hand)
    for units in (False, True):
        monkeypatch.setattr(step_layout, "cpu_has_bf16_units", lambda: units)
        want = grouped_attention(q[:, :, 0], k, v, mask, widen=not units)
        assert torch.equal(decode_attention(q, k, v, mask), want), units
