"""The paged KV cache on the real model: the same greedy tokens as the slot cache, in every mix."""

from __future__ import annotations

import pytest
import torch

from batchlab.backends.model_backend import ModelBackend
from batchlab.engine import Engine
from batchlab.kv_blocks import check_books
from batchlab.model.llama import SeqChunk, forward_step
from batchlab.model.paged_kv_cache import PagedKVCache, PagedSeqChunk
from batchlab.requests import Request
from batchlab.schedulers import ContinuousBatcher, DynamicBatcher

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three uses of copper.",
    "Explain photosynthesis in one sentence.",
    "What is 12 times 7?",
    "Why is the sky blue? Answer briefly, please, in simple words that a child understands.",
]


@pytest.fixture(scope="module")
def workload(lm) -> list[Request]:
    """Mixed prompts and output lengths; later ones arrive while earlier ones decode."""
    return [Request(f"q{i}", lm.chat_ids(q), 10 + 3 * i, arrival_time=0.05 * i)
            for i, q in enumerate(QUESTIONS)]


@pytest.fixture(scope="module")
def slot_outputs(lm, workload) -> dict[str, list[int]]:
    trace = Engine(ContinuousBatcher(8, 32), ModelBackend(lm, num_slots=8, max_seq_len=128)).run(workload)
    return {r.request_id: r.output_ids for r in trace.requests}


def outputs(trace) -> dict[str, list[int]]:
    return {r.request_id: r.output_ids for r in trace.requests}


def test_one_step_gives_the_same_logits_through_block_tables(weights):
    """A prompt chunk, a later chunk and decodes, with scattered blocks: the slot cache's logits."""
    gen = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, weights.config.vocab_size, (n,), generator=gen).tolist() for n in (20, 37, 5)]
    slot = weights.new_kv_cache(3, 64)
    paged = weights.new_paged_kv_cache(20, block_size=4, max_seq_len=64)
    tables = [[9, 2, 14, 0, 7, 11], [1, 3, 5, 6, 8, 10, 12, 13, 15, 4], [19, 16]]
    # Step 1: whole prompts of 0 and 2, first 30 tokens of 1.
    first = [(0, 0, ids[0]), (1, 0, ids[1][:30]), (2, 0, ids[2])]
    # Step 2: decodes of 0 and 2 (one token each), the rest of 1's prompt.
    second = [(0, 20, [11]), (2, 5, [12]), (1, 30, ids[1][30:])]
    for step in (first, second):
        a = forward_step(weights, slot, [SeqChunk(s, start, t, True) for s, start, t in step])
        b = forward_step(weights, paged, [PagedSeqChunk(tables[s], start, t, True) for s, start, t in step])
        assert torch.allclose(a, b, atol=1e-4, rtol=0), (a - b).abs().max()


def test_decodes_of_very_different_contexts_attend_in_groups_and_give_the_same_logits(weights, monkeypatch):
    """Decodes at positions 5-300 in one step attend in groups, each padded to its own longest
    context (``context_groups``): the logits are those of one group padded to the longest, within
    fp32 rounding (the attention kernel's blocking follows the padded length, as it does whenever
    a batch's longest context changes), and the slot cache's."""
    from batchlab.model import step_layout
    from batchlab.model.step_layout import context_groups
    gen = torch.Generator().manual_seed(1)
    lengths = [300, 12, 260, 5, 40, 290, 8]
    assert len(context_groups([n + 1 for n in lengths])) > 1                  # the step really splits
    bs, vocab = 4, weights.config.vocab_size
    tables, next_block = [], 0
    for n in lengths:
        need = -(-(n + 1) // bs)
        tables.append(list(range(next_block, next_block + need))[::-1])   # scattered, in reverse
        next_block += need
    paged = weights.new_paged_kv_cache(next_block, block_size=bs, max_seq_len=512)
    slot = weights.new_kv_cache(len(lengths), 512)
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
    for i, (ids, table) in enumerate(zip(prompts, tables)):                    # each prompt, alone
        forward_step(weights, paged, [PagedSeqChunk(table, 0, ids, True)])
        forward_step(weights, slot, [SeqChunk(i, 0, ids, True)])
    step = [(i, n, [7 + i]) for i, n in enumerate(lengths)]
    chunks = [PagedSeqChunk(tables[i], start, t, True) for i, start, t in step]
    grouped = forward_step(weights, paged, chunks)
    monkeypatch.setattr(step_layout, "GROUP_CALL_KEYS", 10**9)                # one group, as before
    assert len(context_groups([n + 1 for n in lengths])) == 1
    one_group = forward_step(weights, paged, chunks)
    slots = forward_step(weights, slot, [SeqChunk(i, start, t, True) for i, start, t in step])
    tol = 1e-4 if weights.dtype == torch.float32 else 0.5
    assert torch.allclose(grouped, one_group, atol=tol, rtol=0), (grouped - one_group).abs().max()
    if weights.dtype == torch.float32:
        assert torch.equal(grouped.argmax(-1), one_group.argmax(-1))
    assert torch.allclose(grouped, slots, atol=tol, rtol=0), (grouped - slots).abs().max()


def test_paged_cache_validates_its_config(weights):
    with pytest.raises(ValueError, match="block_size=0"):
        weights.new_paged_kv_cache(8, block_size=0)
    with pytest.raises(ValueError, match="memory_bytes=1,000 is below one block"):
        PagedKVCache.from_budget(1000, 30, 3, 64)
    with pytest.raises(ValueError, match="reserve_blocks=-1"):
        weights.new_paged_kv_cache(8, reserve_blocks=-1)


def test_mixed_prompts_chunked_prefill_and_joins_match_the_slot_cache(lm, workload, slot_outputs):
    backend = ModelBackend(lm, num_slots=8, max_seq_len=128, paged=True)
    trace = Engine(ContinuousBatcher(8, 32), backend).run(workload)
    assert outputs(trace) == slot_outputs
    assert any(c.start > 0 and c.num_tokens > 1 for s in trace.steps for c in s.chunks)   # chunked
    assert not trace.preemptions and backend.kv.used_blocks == 0


def test_preemption_and_recompute_give_the_same_tokens(lm, workload, slot_outputs):
    """12 blocks of 16 tokens cannot hold six chats at once: requests are preempted and recomputed."""
    backend = ModelBackend(lm, max_seq_len=128, paged=True, num_kv_blocks=12)
    trace = Engine(ContinuousBatcher(8, 32), backend).run(workload)
    assert trace.preemptions, "the small cache should have preempted someone"
    assert any(p.num_output_tokens > 0 for p in trace.preemptions)   # recompute covers outputs too
    assert outputs(trace) == slot_outputs
    check_books(backend.kv)
    assert backend.kv.used_blocks == 0


def test_prefix_hits_give_the_same_tokens(lm, workload, slot_outputs):
    """Every chat prompt starts with the same system prompt, so later requests hit its blocks."""
    backend = ModelBackend(lm, num_slots=8, max_seq_len=128, paged=True, enable_prefix_caching=True)
    trace = Engine(ContinuousBatcher(8, 32), backend).run(workload)
    assert backend.kv.num_hit_tokens >= 16 * (len(workload) - 1)
    assert any(c.start > 0 for s in trace.steps for c in s.chunks
               if c.request_id == "q5" and s.start == trace.requests[5].first_scheduled_time)
    assert outputs(trace) == slot_outputs


def test_request_level_batching_reserves_whole_lengths_on_the_paged_cache(lm, workload, slot_outputs):
    backend = ModelBackend(lm, num_slots=8, max_seq_len=128, paged=True)
    trace = Engine(DynamicBatcher(4, timeout=0.1), backend).run(workload)
    assert outputs(trace) == slot_outputs and not trace.preemptions
