"""Paged KV accounting (kv_blocks.BlockManager) and what the schedulers do with it, on the simulator."""

from __future__ import annotations

import random

import pytest

from batchlab.sim import SimBackend
from batchlab.steptime.cost_model import CostModel
from batchlab.engine import Engine
from batchlab.kv_blocks import BlockManager, blocks_for, check_books
from batchlab.kv_space import KVSpace, TokenKVSpace
from batchlab.requests import Request, RequestStatus
from batchlab.schedulers import ContinuousBatcher, DynamicBatcher, StaticBatcher

ONE_SECOND = CostModel(fixed_s=1.0, per_seq_s=0.0, per_token_s=0.0, per_attention_pair_s=0.0)
RULER = CostModel(fixed_s=0.010, per_seq_s=0.001, per_token_s=0.002, per_attention_pair_s=0.0)


def req(rid: str, prompt: int, out: int, arrival: float = 0.0, ids: list[int] | None = None) -> Request:
    if ids is not None:
        return Request(rid, ids, out, arrival_time=arrival)
    return Request(rid, None, out, arrival_time=arrival, prompt_len=prompt)


# --- the block manager on its own ---------------------------------------------------------------------
def test_blocks_are_handed_out_as_a_sequence_grows_and_all_come_back():
    kv = BlockManager(num_blocks=4, block_size=4)
    assert isinstance(kv, KVSpace) and isinstance(TokenKVSpace(8), KVSpace)
    assert kv.admit("a", 5, 5) == 0                      # 5 tokens: 2 blocks
    assert kv.block_table("a") == [0, 1] and kv.used_blocks == 2 and kv.used_tokens == 8
    assert kv.grow("a", 3)                               # 8 tokens: still 2 blocks
    assert kv.used_blocks == 2 and kv.held_tokens == 8
    assert kv.grow("a", 1)                               # 9 tokens: a third block
    assert len(kv.block_table("a")) == 3 and kv.num_free_blocks == 1
    assert kv.can_grow("a", 7) and not kv.can_grow("a", 8)   # 16 tokens fit, 17 do not
    assert not kv.grow("a", 8) and kv.held_tokens == 9   # no room: refused, nothing changed
    with pytest.raises(ValueError, match="num_tokens=-1"):
        kv.grow("a", -1)
    check_books(kv)
    kv.free("a")
    assert kv.used_blocks == 0 and kv.num_free_blocks == 4
    check_books(kv)
    with pytest.raises(KeyError, match="freed twice"):
        kv.free("a")



def test_grow_each_grows_in_order_and_stops_at_the_first_without_room():
    kv = BlockManager(num_blocks=4, block_size=4)
    for rid, n in [("a", 4), ("b", 3), ("c", 4)]:
        kv.admit(rid, n, n)                      # a, b and c hold a block each; one block is free
    assert kv.grow_each(["b", "a", "c"]) == 2    # b fits its block, a takes the free one, c: none
    assert [kv.num_tokens_of[r] for r in "abc"] == [5, 4, 4] and kv.num_free_blocks == 0
    check_books(kv)
    kv.free("b")
    assert kv.grow_each(["c", "a"]) == 2                # c takes b's block, a has room in its own
    assert [kv.num_tokens_of[r] for r in "ac"] == [6, 5] and kv.num_free_blocks == 0
    assert TokenKVSpace(8).grow_each(["x", "y"]) == 2   # a reservation always has room

def test_admission_leaves_the_reserve_and_fits_ever_counts_it():
    kv = BlockManager(num_blocks=4, block_size=4, reserve_blocks=1)
    assert kv.fits_ever(12) and not kv.fits_ever(13)     # 3 blocks + 1 reserved = the pool
    kv.admit("a", 8, 8)
    assert not kv.can_admit(5, 5) and kv.can_admit(4, 4)  # 2 free, 1 of them kept back
    kv.admit("b", 4, 4)
    assert kv.num_free_blocks == 1 and kv.can_grow("a", 4)  # growth may use the reserve


@pytest.mark.parametrize("kwargs, bad", [
    (dict(num_blocks=4, block_size=0), "block_size=0"),
    (dict(num_blocks=0, block_size=16), "num_blocks=0"),
    (dict(num_blocks=4, block_size=16, reserve_blocks=-1), "reserve_blocks=-1"),
    (dict(num_blocks=4, block_size=16, reserve_blocks=4), "reserve_blocks=4"),
])
def test_bad_configs_name_the_value(kwargs, bad):
    with pytest.raises(ValueError, match=bad):
        BlockManager(**kwargs)


def test_a_budget_below_one_block_is_refused_by_the_simulator():
    with pytest.raises(ValueError, match="capacity_tokens=10 is below one block of block_size=16"):
        SimBackend(RULER, kv_capacity_tokens=10, block_size=16)
    with pytest.raises(ValueError, match="block_size=0"):
        SimBackend(RULER, kv_capacity_tokens=100, block_size=0)
    with pytest.raises(ValueError, match="reserve_blocks=-2"):
        SimBackend(RULER, kv_capacity_tokens=100, block_size=16, reserve_blocks=-2)
    with pytest.raises(ValueError, match="need a paged cache"):
        SimBackend(RULER, kv_capacity_tokens=100, enable_prefix_caching=True)


def test_prefix_blocks_are_shared_by_chained_hash_and_evicted_least_recently_freed_first():
    kv = BlockManager(num_blocks=6, block_size=4, enable_prefix_caching=True)
    system = [7, 7, 7, 7, 8, 8, 8, 8]                    # two full blocks
    a, b = system + [1, 2], system + [3]
    assert kv.admit("a", len(a), len(a), a) == 0              # computes everything: 3 blocks
    assert kv.num_cached_blocks == 2                     # the two full prompt blocks
    assert kv.cached_prefix_tokens(b, len(b) - 1) == 8
    assert kv.admit("b", len(b), len(b), b) == 8              # shares 2 blocks, adds 1
    assert kv.block_table("b")[:2] == kv.block_table("a")[:2] and kv.used_blocks == 4
    # The same second block after a different first block is not a hit: the hash is chained.
    other = [9, 9, 9, 9, 8, 8, 8, 8, 1]
    assert kv.cached_prefix_tokens(other, 8) == 0
    # A whole-prompt hit still leaves the last token to compute (its step makes the logits).
    assert kv.cached_prefix_tokens(system, len(system) - 1) == 4
    kv.free("a")
    kv.free("b")
    check_books(kv)
    assert kv.used_blocks == 0 and kv.num_cached_blocks == 2   # free, but still cached
    assert kv.admit("c", len(b), len(b), b) == 8                    # a hit on free cached blocks
    kv.free("c")
    # Filling the pool evicts: first the uncached free blocks, then the least recently freed.
    kv.admit("d", 16, 16)                                  # 4 blocks: 4 uncached free ones
    assert kv.num_cached_blocks == 2 and kv.num_evictions == 0
    kv.admit("e", 4, 4)                                   # one more: evicts the tail block
    assert kv.num_evictions == 1 and kv.cached_prefix_tokens(b, 8) == 4
    check_books(kv)


def test_prompt_hashes_and_hits_are_remembered_per_prompt_and_give_the_same_hits_as_fresh_ones(monkeypatch):
    import batchlab.kv_blocks as kv_blocks

    kv = BlockManager(num_blocks=32, block_size=4, enable_prefix_caching=True)
    prompt = list(range(20))
    kv.admit("a", len(prompt), len(prompt), prompt)
    same_tokens = list(prompt)                         # another list with the same tokens hits too
    assert kv.cached_prefix_tokens(same_tokens, 19) == kv.cached_prefix_tokens(prompt, 19) == 16
    hashes, tokens = kv.block_chain(prompt, 5)
    assert kv.block_chain(prompt, 5)[0] is hashes     # computed once, then remembered
    assert tokens == [tuple(prompt[i:i + 4]) for i in range(0, 20, 4)]
    # The hits found are remembered too, and blocks cached since extend them (an eviction, which
    # forgets them, is in the test above).
    longer = prompt + list(range(50, 58))             # 7 blocks: the first 5 are cached
    assert kv.cached_prefix_tokens(longer, 27) == 20
    kv.admit("f", len(longer), len(longer), longer)
    assert kv.cached_prefix_tokens(longer, 27) == 24 and kv.cached_prefix_tokens(longer, 11) == 8
    # A full memo is cleared, and the hits stay the same (the hashes are computed again).
    monkeypatch.setattr(kv_blocks, "_CHAIN_MEMO_SIZE", 2)
    for i in range(3):
        kv.cached_prefix_tokens(list(range(100 + i, 120 + i)), 19)
    assert len(kv._chains) <= 2 and kv.cached_prefix_tokens(list(prompt), 19) == 16


def test_growth_takes_a_block_only_when_the_last_one_is_full_and_never_past_max_seq_len():
    kv = BlockManager(num_blocks=4, block_size=4, max_seq_len=10, enable_prefix_caching=True)
    kv.admit("a", 3, 10, [5, 6, 7, 8, 9, 10])          # a first chunk of 3: a prompt block not yet full
    table = kv.block_table("a")
    assert kv.num_cached_blocks == 0
    assert kv.grow("a", 1) and len(table) == 1 and kv.num_cached_blocks == 1   # full: hashed
    assert kv.grow("a", 1) and len(table) == 2          # token 5 starts a new block
    assert kv.grow("a", 3) and len(table) == 2          # tokens 6-8 fit in it
    assert kv.grow("a", 2) and len(table) == 3          # 10 tokens: max_seq_len
    assert not kv.grow("a", 1) and kv.num_tokens_of["a"] == 10    # refused; nothing changed
    check_books(kv)
    with pytest.raises(ValueError, match="num_tokens=-1"):
        kv.grow("a", -1)


# --- schedulers on a paged simulator ------------------------------------------------------------------
class RecordingSim(SimBackend):
    """The simulator, noting the blocks in use at every step (to check the budget is never passed)."""

    def run(self, plan, requests):
        self.used_per_step.append(self.kv.used_blocks)
        check_books(self.kv)
        return super().run(plan, requests)

    def reset(self):
        super().reset()
        self.used_per_step = []


def test_hand_computed_preemption_scenario():
    """4 blocks of 4 tokens; A and B: 4-token prompts, 8 output tokens each; every step 1 s.

    t=0: both admitted with 1 block each (their prompts). t=1: both step to position 4 and take a
    second block (pool full). t=5: A needs a third block for position 8; B, the most recently
    admitted, is preempted with 8 computed tokens and 5 outputs; its 2 blocks go to A (1 used,
    1 free). B cannot come back while A runs (its 9 known tokens need 3 blocks). A finishes at
    t=8, B is recomputed in one chunk of 9 tokens at t=8 and finishes at t=11.
    """
    backend = RecordingSim(ONE_SECOND, kv_capacity_tokens=16, block_size=4)
    requests = [req("A", 4, 8), req("B", 4, 8)]
    # Every step through backend.run (no fast path), so the recorder sees each one.
    trace = Engine(ContinuousBatcher(max_num_seqs=8, max_num_batched_tokens=64), backend,
                   fast_decode_runs=False).run(requests)
    assert [(p.request_id, p.time, p.num_computed_tokens, p.num_output_tokens)
            for p in trace.preemptions] == [("B", 5.0, 8, 5)]
    a, b = trace.requests
    assert a.token_times == [1, 2, 3, 4, 5, 6, 7, 8]
    assert b.token_times == [1, 2, 3, 4, 5, 9, 10, 11]
    resume = [c for s in trace.steps for c in s.chunks if c.request_id == "B" and s.start == 8.0]
    assert [(c.start, c.num_tokens, c.samples) for c in resume] == [(0, 9, True)]
    assert max(backend.used_per_step) == 4 and backend.kv.used_blocks == 0
    assert trace.meta["num_preemptions"] == 1
    # With reservation (the same 16 tokens), B waits for A instead: no preemption, no recompute.
    reserved = Engine(ContinuousBatcher(8, 64), SimBackend(ONE_SECOND, 16)).run(requests)
    assert not reserved.preemptions and reserved.requests[1].token_times[0] == 9.0


def workload(n: int, seed: int, rate: float, burst: bool = False, shared: bool = False) -> list[Request]:
    rng = random.Random(seed)
    system = [rng.randrange(1000) for _ in range(40)]
    t, out = 0.0, []
    for i in range(n):
        t += (rng.expovariate(rate / 8) if i % 8 == 0 else rng.uniform(0, 0.001)) if burst \
            else rng.expovariate(rate)
        prompt_len = rng.randint(1, 60)
        ids = (system if shared else []) + [rng.randrange(1000) for _ in range(prompt_len)]
        out.append(Request(f"r{i}", ids, rng.randint(1, 40), arrival_time=t))
    return out


POLICIES = {
    "static": lambda: StaticBatcher(4),
    "dynamic": lambda: DynamicBatcher(4, timeout=0.05, stream=True),
    "continuous": lambda: ContinuousBatcher(max_num_seqs=8, max_num_batched_tokens=64),
    "continuous-no-chunking": lambda: ContinuousBatcher(8, 128, chunked_prefill=False),
    "continuous-tight": lambda: ContinuousBatcher(max_num_seqs=8, max_num_batched_tokens=8),
}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("load", ["overload", "bursty", "light"])
@pytest.mark.parametrize("prefix", [False, True])
def test_no_block_is_leaked_or_double_freed_and_the_budget_holds(policy, load, prefix):
    requests = {"overload": lambda: workload(50, 1, 1000.0, shared=prefix),
                "bursty": lambda: workload(50, 2, 5.0, burst=True, shared=prefix),
                "light": lambda: workload(20, 3, 0.5, shared=prefix)}[load]()
    backend = RecordingSim(RULER, kv_capacity_tokens=320, block_size=16, enable_prefix_caching=prefix)
    trace = Engine(POLICIES[policy](), backend).run(requests)   # the engine checks nobody is lost
    check_books(backend.kv)
    assert backend.kv.used_blocks == 0 and not backend.kv.tables
    assert max(backend.used_per_step) <= backend.kv.num_blocks
    finished = [r for r in trace.requests if r.status is RequestStatus.FINISHED]
    assert len(finished) == len(requests)
    # Each preemption's lost tokens are computed again: a request's chunks add up to its prompt,
    # its outputs but the last, and what it lost, less its prefix hits.
    computed = sum(c.num_tokens for s in trace.steps for c in s.chunks)
    lost = sum(p.num_computed_tokens for p in trace.preemptions)
    needed = sum(r.prompt_len + r.max_new_tokens - 1 for r in requests)
    assert computed == needed + lost - backend.kv.num_hit_tokens
    if policy.startswith("continuous") and load == "overload":
        assert trace.preemptions, "an overloaded 20-block cache should preempt"
    if not policy.startswith("continuous"):
        assert not trace.preemptions   # request-level batchers reserve whole lengths


def test_prefix_caching_cuts_the_computed_tokens_and_changes_no_output_count():
    requests = workload(30, 4, 2.0, shared=True)
    traces = {}
    for prefix in (False, True):
        backend = SimBackend(RULER, kv_capacity_tokens=4096, block_size=16, enable_prefix_caching=prefix)
        traces[prefix] = Engine(ContinuousBatcher(16, 256), backend).run(requests)
    computed = {p: sum(c.num_tokens for s in t.steps for c in s.chunks) for p, t in traces.items()}
    assert computed[False] - computed[True] >= 29 * 32   # 2 shared blocks of 16 for all but the first
    assert [r.num_output_tokens for r in traces[True].requests] == \
        [r.num_output_tokens for r in traces[False].requests]


def test_blocks_for():
    assert [blocks_for(n, 16) for n in (1, 16, 17, 32, 33)] == [1, 1, 2, 2, 3]


def test_preemption_stats_count_what_the_trace_records_and_saving_such_a_trace_says_it_cannot():
    from batchlab.analysis.metrics import preemption_stats
    from batchlab.analysis.trace_io import trace_to_dict
    trace = Engine(ContinuousBatcher(8, 64), SimBackend(ONE_SECOND, 16, block_size=4)).run(
        [req("A", 4, 8), req("B", 4, 8)])
    assert preemption_stats(trace) == {"num_preemptions": 1, "num_preempted_requests": 1,
                                       "recomputed_tokens": 8}
    assert list(trace.preemptions_df().columns) == ["request_id", "time", "num_computed_tokens",
                                                    "num_output_tokens"]
    with pytest.raises(ValueError, match="preemptions or prefix-cache hits"):
        trace_to_dict(trace)


def test_kv_usage_reads_back_what_each_cache_held():
    from batchlab.analysis.kv_usage import kv_usage, stored_share
    trace = Engine(ContinuousBatcher(8, 64), SimBackend(ONE_SECOND, 16, block_size=4)).run(
        [req("A", 4, 8), req("B", 4, 8)])
    usage = kv_usage(trace, block_size=4, slot_len=12).set_index("start")
    # t=0: both prompts (4 tokens each); t=5: B preempted, A at 9 tokens; t=8: B back with 9.
    assert usage.loc[0.0, "stored_tokens"] == 8 and usage.loc[0.0, "paged_tokens"] == 8
    assert usage.loc[5.0, "num_seqs"] == 1 and usage.loc[5.0, "paged_tokens"] == 12
    assert usage.loc[8.0, "stored_tokens"] == 9 and usage.loc[8.0, "slot_tokens"] == 12
    assert usage["paged_tokens"].max() <= 16
    assert 0 < stored_share(usage, "slot_tokens") < stored_share(usage, "paged_tokens") <= 1
    with pytest.raises(ValueError, match="held='nope'"):
        stored_share(usage, "nope")


def test_a_request_that_can_never_fit_the_block_pool_is_rejected_with_the_reason():
    backend = SimBackend(ONE_SECOND, kv_capacity_tokens=64, block_size=16)   # 4 blocks
    trace = Engine(ContinuousBatcher(8, 256), backend).run([req("big", 60, 10), req("ok", 10, 5)])
    big, ok = trace.requests
    assert big.status is RequestStatus.REJECTED and "needs 70 KV tokens" in big.finish_detail
    assert ok.status is RequestStatus.FINISHED and not trace.preemptions


def test_requests_without_prompt_ids_never_hit_the_prefix_cache():
    backend = SimBackend(RULER, kv_capacity_tokens=1024, block_size=16, enable_prefix_caching=True)
    Engine(ContinuousBatcher(8, 256), backend).run([req(f"r{i}", 64, 4, arrival=i) for i in range(4)])
    assert backend.kv.num_hit_tokens == 0 and backend.kv.num_cached_blocks == 0
