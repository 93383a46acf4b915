"""The batched step against transformers: same greedy tokens, same logits, in any mix."""

import copy

import pytest
import torch

from batchlab.model.llama import SeqChunk, forward_step
from batchlab.model.sampling import RequestSampler, top_p_filter
from batchlab.requests import Request, SamplingParams

NEW_TOKENS = 32
LOGIT_ATOL = 2e-3  # fp32; observed differences are ~5e-5 on logits of magnitude ~25

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three uses of copper.",
    "Explain photosynthesis in one sentence.",
    "What is 12 times 7?",
    "Name a famous painting by Leonardo da Vinci.",
    "Give me a tip for learning to cook rice.",
    "Why is the sky blue? Answer briefly, please, in simple words that a child understands.",
]


@pytest.fixture(scope="module")
def prompts(lm):
    return [lm.chat_ids(q) for q in QUESTIONS]


@pytest.fixture(scope="module")
def reference(lm, prompts):
    """transformers' own greedy tokens and last-position logits for each prompt, alone.

    Like batchlab's requests (and serving benchmarks' ignore_eos), generation runs past the end
    token: the model's generation config is swapped for one without ``eos_token_id``. (Passing
    ``min_new_tokens`` instead would mask the end token's logit and change the argmax.)"""
    config = copy.deepcopy(lm.model.generation_config)
    config.eos_token_id, config.pad_token_id = None, lm.tokenizer.pad_token_id
    config.do_sample, config.max_new_tokens = False, NEW_TOKENS
    saved, lm.model.generation_config = lm.model.generation_config, config
    refs = []
    try:
        for ids in prompts:
            x = torch.tensor([ids])
            with torch.no_grad():
                logits = lm.model(x).logits[0, -1]
                out = lm.model.generate(x, attention_mask=torch.ones_like(x))
            assert out.shape[1] == len(ids) + NEW_TOKENS
            refs.append((out[0, len(ids):].tolist(), logits))
    finally:
        lm.model.generation_config = saved
    return refs


def greedy_alone(weights, ids, chunk_sizes=None):
    cache = weights.new_kv_cache(1, len(ids) + NEW_TOKENS)
    pos, first_logits = 0, None
    for n in chunk_sizes or [len(ids)]:
        logits = forward_step(weights, cache, [SeqChunk(0, pos, ids[pos:pos + n], pos + n == len(ids))])
        pos += n
    assert pos == len(ids)
    first_logits = logits[0]
    out = [int(logits[0].argmax())]
    while len(out) < NEW_TOKENS:
        logits = forward_step(weights, cache, [SeqChunk(0, pos, [out[-1]], True)])
        pos += 1
        out.append(int(logits[0].argmax()))
    return out, first_logits


@pytest.fixture(scope="module")
def alone(weights, prompts):
    """batchlab's greedy tokens and prompt logits for each prompt served alone (computed once)."""
    return [greedy_alone(weights, ids) for ids in prompts]


def test_prompt_logits_match_transformers(alone, reference):
    for (_, logits), (_, ref_logits) in zip(alone, reference):
        assert torch.allclose(logits, ref_logits, atol=LOGIT_ATOL), (logits - ref_logits).abs().max()


def test_each_prompt_alone_matches_generate(alone, reference):
    for (tokens, _), (ref_tokens, _) in zip(alone, reference):
        assert tokens == ref_tokens


def test_chunked_prefill_matches_generate(weights, prompts, reference):
    ids = prompts[7]
    sizes = [5, 11, len(ids) - 16]
    tokens, logits = greedy_alone(weights, ids, sizes)
    assert tokens == reference[7][0]
    assert torch.allclose(logits, reference[7][1], atol=LOGIT_ATOL)


def test_mixed_steps_match_generate(weights, prompts, reference):
    """All prompts share steps: they join at different steps (while others decode), prefill in
    chunks of different sizes (prompt 3 in three chunks), and sit in scattered KV slots."""
    n = len(prompts)
    cache = weights.new_kv_cache(n + 2, max(map(len, prompts)) + NEW_TOKENS)
    join_step = [0, 0, 2, 3, 3, 6, 9, 12]
    chunk_limit = {3: 9, 6: 7}          # prompt 3 and 6 are prefilled in several chunks
    slot = [n + 1 - i for i in range(n)]  # slots in reverse order, one left unused
    pos = [0] * n
    outs: list[list[int]] = [[] for _ in range(n)]
    step = 0
    while any(len(o) < NEW_TOKENS for o in outs):
        chunks, owners = [], []
        for i in range(n):
            if step < join_step[i] or len(outs[i]) >= NEW_TOKENS:
                continue
            if pos[i] < len(prompts[i]):
                take = min(chunk_limit.get(i, len(prompts[i])), len(prompts[i]) - pos[i])
                toks = prompts[i][pos[i]:pos[i] + take]
            else:
                toks = [outs[i][-1]]
            last = pos[i] + len(toks) >= len(prompts[i])
            chunks.append(SeqChunk(slot[i], pos[i], toks, last))
            owners.append((i, last))
            pos[i] += len(toks)
        logits = forward_step(weights, cache, chunks)
        row = 0
        for i, last in owners:
            if last:
                outs[i].append(int(logits[row].argmax()))
                row += 1
        step += 1
    for i in range(n):
        assert outs[i] == reference[i][0], f"prompt {i} diverged"


def test_slots_stay_packed_and_moved_sequences_keep_their_past(weights, prompts, reference):
    """Sequences leave the slot cache at different steps, the lowest slots first; each time the
    sequence in the highest busy slot moves into the hole with its past, the busy slots stay
    0..n-1, and every sequence still gets transformers' tokens."""
    n = len(prompts)
    cache = weights.new_kv_cache(n, max(map(len, prompts)) + NEW_TOKENS)
    budget = [4 + 4 * i for i in range(n - 1)] + [NEW_TOKENS]   # slot 0 leaves first, the last stays
    ids = [f"r{i}" for i in range(n)]
    for rid, p in zip(ids, prompts):
        cache.admit(rid, len(p), len(p) + NEW_TOKENS)
    pos, outs, moved = [0] * n, [[] for _ in range(n)], set()
    while any(len(o) < b for o, b in zip(outs, budget)):
        live = [i for i in range(n) if len(outs[i]) < budget[i]]
        chunks = [cache.seq_chunk(ids[i], pos[i], prompts[i] if not outs[i] else [outs[i][-1]], True)
                  for i in live]
        logits = forward_step(weights, cache, chunks)
        for row, i in enumerate(live):
            pos[i] += len(chunks[row].token_ids)
            outs[i].append(int(logits[row].argmax()))
            if len(outs[i]) == budget[i]:
                cache.free(ids[i])
        busy = {i: cache.slot_of(ids[i]) for i in range(n) if len(outs[i]) < budget[i]}
        moved |= {i for i, slot in busy.items() if slot != i}
        assert sorted(busy.values()) == list(range(len(busy)))
    assert len(moved) >= 3, moved
    for i in range(n):
        assert outs[i] == reference[i][0][:budget[i]], f"prompt {i} diverged"


def test_bad_inputs_name_the_value(weights):
    cache = weights.new_kv_cache(2, 64)
    vocab = weights.config.vocab_size
    with pytest.raises(ValueError, match="at least one sequence chunk"):
        forward_step(weights, cache, [])
    with pytest.raises(ValueError, match="no tokens"):
        forward_step(weights, cache, [SeqChunk(0, 0, [], True)])
    with pytest.raises(ValueError, match=f"token id {vocab}"):
        forward_step(weights, cache, [SeqChunk(0, 0, [1, vocab], True)])
    with pytest.raises(ValueError, match="token id -1"):
        forward_step(weights, cache, [SeqChunk(0, 0, [-1], True)])
    with pytest.raises(ValueError, match="go past the limit of 64"):
        forward_step(weights, cache, [SeqChunk(0, 60, [1] * 5, True)])
    with pytest.raises(ValueError, match="slot=5"):
        forward_step(weights, cache, [SeqChunk(5, 0, [1], True)])
    with pytest.raises(ValueError, match="context length"):
        weights.new_kv_cache(1, weights.config.max_position + 1)


def test_sampling_is_independent_of_batch_mates():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=7), SamplingParams(),
              SamplingParams(temperature=1.0, seed=3)]
    reqs = [Request(rid, [1, 2], 4, sampling=p) for rid, p in zip("abc", params)]
    together = [RequestSampler().sample(logits, reqs)[0] for _ in range(2)]
    assert together[0] == together[1]                     # seeded: reproducible
    alone = RequestSampler().sample(logits[:1], reqs[:1])[0]
    assert alone[0] == together[0][0]                     # same draw with or without neighbours
    assert together[0][1] == int(logits[1].argmax())      # greedy row


def test_top_p_keeps_the_smallest_nucleus():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    kept = top_p_filter(probs, 0.7)
    assert torch.allclose(kept, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    assert torch.equal(top_p_filter(probs, 1.0), probs)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(temperature=1.0, top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)


def test_grouped_decode_attention_equals_torch_attention_in_fp32_and_stays_close_in_bf16():
    import torch.nn.functional as F

    from batchlab.model.step_layout import decode_attention, grouped_attention

    torch.manual_seed(0)
    S, H, KV, hd, ctx = 5, 9, 3, 16, 12
    q, k, v = torch.randn(S, H, 1, hd), torch.randn(S, KV, ctx, hd), torch.randn(S, KV, ctx, hd)
    lengths = torch.tensor([1, 12, 5, 7, 3])
    mask = (torch.arange(ctx)[None, :] < lengths[:, None])[:, None, None, :]
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)[:, :, 0]
    assert torch.allclose(grouped_attention(q[:, :, 0], k, v, mask), ref, atol=1e-5)
    assert torch.equal(decode_attention(q, k, v, mask), ref)            # fp32 keeps torch's kernel
    got = decode_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask)   # bf16 on a CPU: grouped
    assert got.dtype == torch.bfloat16 and (got.float() - ref).abs().max() < 0.05
