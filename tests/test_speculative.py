"""Speculative decoding: prompt lookup drafts, checks in the batched step, and the invariant that
proves it (greedy outputs with speculation equal those without, in fp32, on both caches)."""

import copy
from dataclasses import replace
import json
import random

import pytest
import torch

from batchlab.engine_args import EngineArgs
from batchlab.analysis.trace_io import trace_from_dict, trace_to_dict
from batchlab.backends.model_backend import ModelBackend
from batchlab.engine import Engine
from batchlab.kv_blocks import BlockManager, check_books
from batchlab.model.divergence import NEAR_TIE, parted_between
from batchlab.model.llama import LlamaWeights, forward_step
from batchlab.model.sampling import RequestSampler
from batchlab.model.verify import accept_greedy, verify_draft
from batchlab.plan import ScheduledChunk, chunk_counts
from batchlab.requests import Request, SamplingParams
from batchlab.schedulers import ContinuousBatcher, StaticBatcher
from batchlab.speculative import SpeculativeConfig, propose_ngram
from batchlab.workloads.tasks import task_requests

SPEC = SpeculativeConfig(4, method="ngram", prompt_lookup_min=2, prompt_lookup_max=3)
EARLY_EXIT = SpeculativeConfig(3, method="early_exit", early_exit_layer=27)
DRAFT_MODEL = SpeculativeConfig(4, method="draft_model", model="Llama-3.2-1B")


# --- prompt lookup, against vLLM's own algorithm ---------------------------------------------------
def vllm_ngram(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """vLLM 0.32's ``_find_longest_matched_ngram_and_propose_tokens`` (KMP over the reversed
    tokens), transcribed without numba, as the reference."""
    total = len(tokens)
    if total < min_n:
        return []
    rev = tokens[::-1]
    lps, longest, position, prev, i = [0] * max_n, 0, 0, 0, 1
    while i < total:
        if rev[prev] == rev[i]:
            prev += 1
            if prev >= longest:
                longest, position = prev, i
            if i < max_n:
                lps[i] = prev
            if prev == max_n:
                prev = lps[max_n - 1]
            i += 1
        elif prev:
            prev = lps[prev - 1]
        else:
            i += 1
    if longest < min_n:
        return []
    start = total - 1 - position + longest
    return tokens[start:start + min(k, total - start)]


def test_prompt_lookup_drafts_what_followed_the_longest_earliest_match():
    assert propose_ngram([1, 2, 3, 4, 1, 2, 3], 2, 1, 3) == [4, 1]
    assert propose_ngram([1, 2, 5, 1, 2, 6, 1, 2], 3, 2, 2) == [5, 1, 2]     # the earliest match
    assert propose_ngram([9, 2, 3, 7, 1, 2, 3], 3, 1, 3) == [7, 1, 2]        # longest: [2, 3]
    assert propose_ngram([7, 8, 7, 8], 5, 2, 2) == [7, 8]                    # the context ends first
    assert propose_ngram([1, 1, 1, 1], 4, 1, 3) == [1]                       # overlapping match
    assert propose_ngram([1, 2, 3, 4], 3, 1, 3) == []                        # no match
    assert propose_ngram([5, 5], 3, 2, 2) == []                              # too short for min_n


def test_prompt_lookup_agrees_with_vllms_algorithm_on_random_texts():
    rng = random.Random(0)
    for _ in range(3000):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        low = rng.randrange(1, 4)
        high, k = rng.randrange(low, 6), rng.randrange(1, 6)
        assert propose_ngram(tokens, k, low, high) == vllm_ngram(tokens, low, high, k), (tokens, low, high, k)


# --- the config: vLLM's names, defaults and rules ----------------------------------------------------
def test_config_takes_vllms_json_and_defaults():
    c = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3}')
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (5, 5)                 # vLLM's default
    assert SpeculativeConfig(2, prompt_lookup_max=4).prompt_lookup_min == 4
    assert SpeculativeConfig(2, prompt_lookup_min=3).prompt_lookup_max == 3
    assert SpeculativeConfig.parse(c.to_json()) == c
    policy = SpeculativeConfig(4, num_speculative_tokens_per_batch_size=[(1, 4, 4), (9, 16, 1), (5, 8, 9)])
    assert [policy.tokens_for_batch(b) for b in (1, 4, 5, 8, 9, 16, 17, 500)] == [4, 4, 4, 4, 1, 1, 1, 1]
    gap = SpeculativeConfig(3, num_speculative_tokens_per_batch_size=[[1, 2, 3], [10, 20, 0]])
    assert [gap.tokens_for_batch(b) for b in (2, 5, 10, 99)] == [3, 3, 0, 0]    # a gap keeps the earlier k


@pytest.mark.parametrize("bad, words", [
    ({"num_speculative_tokens": 0}, "num_speculative_tokens=0"),
    ({"num_speculative_tokens": 2, "method": "eagle"}, "method='eagle'"),
    ({"num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup_min=4"),
    ({"num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": [[2, 8, 1]]}, "start at batch size 1"),
    ({"num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": [[1, 8, 1], [4, 9, 0]]}, "overlap"),
    ({"num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": [[1, 8, -1]]}, "k >= 0"),
    ({"num_speculative_tokens": 2, "draft_tensor_parallel_size": 1}, "not supported"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, 'method "draft_model" needs model'),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "Llama-3.2-1B"},
     'model=\'Llama-3.2-1B\' belongs to method "draft_model"'),
    ({"model": "Llama-3.2-1B", "num_speculative_tokens": 2, "prompt_lookup_min": 2},
     'prompt_lookup_min=2 belongs to method "ngram"'),
    ({"method": "ngram"}, "needs num_speculative_tokens"),
    ({"method": "early_exit", "num_speculative_tokens": 2}, "needs early_exit_layer"),
    ({"method": "early_exit", "num_speculative_tokens": 2, "early_exit_layer": 0}, "early_exit_layer=0"),
    ({"method": "early_exit", "num_speculative_tokens": 2, "early_exit_layer": 8, "prompt_lookup_max": 3},
     'prompt_lookup_max=3 belongs to method "ngram"'),
    ({"num_speculative_tokens": 2, "early_exit_layer": 8}, 'early_exit_layer=8 belongs to method "early_exit"'),
])
def test_bad_configs_name_the_value(bad, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("(", r"\(")):
        SpeculativeConfig.parse(bad)
    with pytest.raises(ValueError, match="not JSON"):
        SpeculativeConfig.parse("{num_speculative_tokens: 2")


def test_a_policy_that_cannot_check_drafts_and_a_draft_past_the_context_are_refused(lm):
    with pytest.raises(ValueError, match="StaticBatcher cannot check speculative drafts"):
        Engine(StaticBatcher(4), ModelBackend(lm, 4, 64, speculative_config=SPEC))
    with pytest.raises(ValueError, match="num_speculative_tokens=64; must be below max_seq_len=64"):
        ModelBackend(lm, 4, 64, speculative_config=replace(SPEC, num_speculative_tokens=64))
    with pytest.raises(ValueError, match=r"early_exit_layer=30; must be in 1..29"):
        ModelBackend(lm, 4, 64, speculative_config=replace(EARLY_EXIT, early_exit_layer=30))
    with pytest.raises(ValueError, match="priced by the simulator only"):
        ModelBackend(lm, 4, 64, speculative_config=DRAFT_MODEL)


def test_a_chunk_with_a_draft_counts_as_one_decode():
    c = ScheduledChunk("r", 10, 4, True, (5, 6, 7))
    assert c.is_decode and chunk_counts([c]) == (4, 0, 1)
    with pytest.raises(ValueError, match="a draft of 3 tokens needs a sampling chunk"):
        ScheduledChunk("r", 10, 3, True, (5, 6, 7))


# --- checking a draft ------------------------------------------------------------------------------
def test_greedy_check_takes_the_matching_prefix_and_one_more():
    assert accept_greedy([5, 6, 7, 8], [5, 6, 7]) == [5, 6, 7, 8]       # all accepted, and the bonus
    assert accept_greedy([5, 9, 7, 8], [5, 6, 7]) == [5, 9]             # the first mismatch replaced
    assert accept_greedy([4, 6, 7, 8], [5, 6, 7]) == [4]


def test_sampled_check_emits_each_token_with_the_models_probability():
    """Rejection sampling keeps the target distribution: the first token emitted is distributed
    as p0 whatever the draft, and the second (emitted only when the draft's first token was
    accepted) as p1. N = 40,000 draws; each token's frequency must be within 5 standard errors
    of its probability (a false alarm about once in 10^6 per token); a distribution off by 0.02
    at a token of p = 0.5 (8 standard errors) fails with probability above 0.999."""
    vocab, n = 6, 40_000
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, vocab, generator=gen) * 1.5                 # (k + 1 = 3, V)
    p = torch.softmax(logits, dim=-1)
    req = Request("s", [1, 2, 3], 8, sampling=SamplingParams(temperature=1.0, seed=7))
    sampler = RequestSampler()
    draft = (int(p[0].argmin()), int(p[1].argmax()))                    # an unlikely first guess
    first, second = torch.zeros(vocab), torch.zeros(vocab)
    for _ in range(n):
        tokens, _ = verify_draft(logits, req, draft, sampler)
        first[tokens[0]] += 1
        if tokens[0] == draft[0]:
            second[tokens[1]] += 1
    for counts, probs in ((first, p[0]), (second, p[1])):
        total = counts.sum()
        assert total > 200
        sigma = (probs * (1 - probs) / total).sqrt()
        assert ((counts / total - probs).abs() <= 5 * sigma + 1e-9).all(), (counts / total, probs)


# --- the invariant: the same answers with speculation as without -------------------------------------
def serve(lm, requests, spec=None, **backend) -> tuple[dict, Engine]:
    max_len = max(r.prompt_len for r in requests) + max(r.max_new_tokens for r in requests)
    max_num_seqs = backend.pop("max_num_seqs", 8)
    engine = Engine(ContinuousBatcher(max_num_seqs, 512),
                    ModelBackend(lm, **{"num_slots": 8, "max_seq_len": max_len, **backend}, speculative_config=spec))
    trace = engine.run(requests)
    return {r.request_id: r.output_ids for r in trace.requests}, engine


def assert_same_answers(lm, requests, base: dict, spec: dict) -> None:
    if lm.dtype == "float32":
        assert spec == base
    else:     # bf16: a different batch shape may part the answers at a near-tie (notebook 04); the
        # margin is measured on raw logits, so only for the requests that take the raw argmax
        plain = {r.request_id: r.prompt_ids for r in requests if r.sampling.plain_greedy}
        parted = parted_between(LlamaWeights.from_hf(lm.model), plain,
                                {"base": {k: base[k] for k in plain}, "spec": {k: spec[k] for k in plain}})
        assert all(margin < NEAR_TIE for _, margin in parted.values()), parted


def mixed_requests(lm, n: int = 6, max_new_tokens: int = 40) -> list[Request]:
    reqs = task_requests("code_edit", n // 2, lm.tokenizer, max_new_tokens) + \
        task_requests("chat", n - n // 2, lm.tokenizer, max_new_tokens)
    # greedy with penalties and min_tokens: each checked position sees the drafts before it
    reqs[1] = reqs[1].fresh_copy(sampling=SamplingParams(repetition_penalty=1.3, min_tokens=30))
    reqs[-1] = reqs[-1].fresh_copy(sampling=SamplingParams(frequency_penalty=0.5, logprobs=2))
    return reqs


PREEMPTING = {"paged": True, "block_size": 16, "num_kv_blocks": 26, "enable_prefix_caching": True}


@pytest.fixture(scope="module")
def answers_without(lm):
    """The answers without speculation, served once per requests and cache setting (the two
    drafters' tests on one cache share them)."""
    served: dict[tuple, dict] = {}

    def answers(requests: list[Request], cache: dict) -> dict:
        key = (tuple(r.request_id for r in requests), repr(sorted(cache.items())))
        if key not in served:
            served[key] = serve(lm, requests, **cache)[0]
        return served[key]
    return answers


@pytest.mark.parametrize("cache, drafter", [
    ({}, SPEC), ({"max_num_seqs": 1}, SPEC), ({"paged": True, "block_size": 16}, SPEC), (PREEMPTING, SPEC),
    ({}, EARLY_EXIT), (PREEMPTING, EARLY_EXIT),     # an early exit borrows room for its passes, and gives it back
], ids=["slots", "slots-batch1", "paged", "paged-preempting", "early-exit-slots", "early-exit-paged-preempting"])
def test_greedy_answers_with_speculation_are_the_answers_without(lm, answers_without, cache, drafter):
    reqs = mixed_requests(lm)
    base = answers_without(reqs, cache)
    spec, engine = serve(lm, reqs, drafter, **cache)
    assert_same_answers(lm, reqs, base, spec)
    checks = [c for r in engine.requests.values() for c in r.spec.checks]
    drafted, accepted = sum(d for d, _ in checks), sum(a for _, a in checks)
    assert drafted > 40 and 0 < accepted < drafted                  # drafts were checked, some kept
    assert len(engine.steps) < sum(len(r.output_ids) for r in engine.requests.values())
    logprobs = engine.requests[reqs[-1].request_id]
    assert len(logprobs.output_logprobs) == len(logprobs.output_ids)
    if cache.get("paged"):
        check_books(engine.backend.kv)
        assert engine.backend.kv.used_blocks == 0 or cache.get("enable_prefix_caching")
    if "num_kv_blocks" in cache:
        assert engine.scheduler.preemptions                          # the run did preempt


def test_an_early_exit_draft_is_what_the_models_first_layers_predict(lm):
    """The self-draft, chained over four tokens, against transformers' own hidden states: each
    drafted token is the argmax of the LM head on layer L's output (after the final norm) with
    the tokens drafted before it appended."""
    from batchlab.model.early_exit import draft_early_exit

    model = lm.model if lm.dtype == "float32" else copy.deepcopy(lm.model).float()   # (bf16 ties would differ)
    weights = LlamaWeights.from_hf(model)
    prompt = task_requests("chat", 1, lm.tokenizer, 8)[0].prompt_ids
    for layer in (6, 27):
        cache = weights.new_kv_cache(1, 256)
        cache.admit("a", len(prompt) + 4, len(prompt) + 4)
        forward_step(weights, cache, [cache.seq_chunk("a", 0, prompt[:-1], False)])
        [draft] = draft_early_exit(weights, cache, layer, [("a", prompt[-1], len(prompt) - 1, 4)])
        with torch.inference_mode():
            hidden = model(torch.tensor([prompt + draft[:-1]]), output_hidden_states=True).hidden_states[layer][0]
            expected = model.lm_head(model.model.norm(hidden[len(prompt) - 1:])).argmax(dim=-1).tolist()
        assert draft == expected, (layer, draft, expected)


@pytest.mark.parametrize("method", [SPEC, EARLY_EXIT], ids=["ngram", "early_exit"])
def test_a_draft_never_runs_past_max_tokens_or_a_stop_token(lm, method):
    reqs = task_requests("code_edit", 3, lm.tokenizer, 40)
    base, _ = serve(lm, reqs)
    # stop at a token that the run without speculation emits mid-way, inside accepted drafts
    rid = reqs[0].request_id
    stop = base[rid][17]
    short = [reqs[0].fresh_copy(stop_token_ids=(stop,)), reqs[1].fresh_copy(max_new_tokens=3),
             reqs[2].fresh_copy(max_new_tokens=9)]
    base_short, _ = serve(lm, short)
    spec_short, engine = serve(lm, short, replace(method, num_speculative_tokens=6))
    assert_same_answers(lm, short, base_short, spec_short)
    assert spec_short[rid][-1] == stop and stop not in spec_short[rid][:-1]
    assert [len(spec_short[r.request_id]) for r in short[1:]] == [3, 9]
    for step in engine.steps:
        for c in step.chunks:
            req = engine.requests[c.request_id]
            assert c.start + c.num_tokens <= req.prompt_len + req.max_new_tokens - 1
    trace = engine.finish()                         # a trace file keeps the checks (a stop inside one too)
    loaded = trace_from_dict(json.loads(json.dumps(trace_to_dict(trace))))
    assert [(r.output_ids, r.token_times, r.spec_checks) for r in loaded.requests] == \
           [(r.output_ids, pytest.approx(r.token_times, abs=1e-6), r.spec_checks) for r in trace.requests]


def test_the_batch_size_policy_turns_drafting_off_in_a_large_batch(lm):
    reqs = task_requests("code_edit", 4, lm.tokenizer, 16)
    policy = replace(SPEC, num_speculative_tokens_per_batch_size=[[1, 2, 3], [3, 64, 0]])
    _, big = serve(lm, reqs, policy)                         # 4 at once: no drafts
    _, small = serve(lm, reqs, policy, max_num_seqs=2)       # 2 at a time: up to 3 drafted
    assert not any(r.spec.checks for r in big.requests.values())
    drafts = [len(c.draft) for s in small.steps for c in s.chunks if c.draft]
    assert drafts and max(drafts) == 3


# --- giving back the room of rejected drafts -----------------------------------------------------
def test_rollback_frees_blocks_that_held_only_rejected_drafts():
    kv = BlockManager(8, block_size=4, enable_prefix_caching=True)
    prompt = list(range(10))
    kv.admit("a", 10, 40, prompt)                    # 3 blocks, 2 full prompt blocks hashed
    assert kv.grow("a", 1 + 5)                       # a decode and a draft of 5: 16 tokens, 4 blocks
    assert len(kv.block_table("a")) == 4
    kv.rollback("a", 4)                              # 4 drafts rejected: 12 tokens, 3 blocks
    assert kv.num_tokens_of["a"] == 12 and len(kv.block_table("a")) == 3
    check_books(kv)
    assert kv.cached_prefix_tokens(prompt, 9) == 8   # the prompt's hashes are kept
    assert kv.grow("a", 1) and len(kv.block_table("a")) == 4
    with pytest.raises(ValueError, match="rollback of num_tokens=20"):
        kv.rollback("a", 20)


# --- the server: --speculative-config, vLLM's speculative metrics, several tokens in one chunk --------
def test_the_server_speculates_streams_accepted_tokens_together_and_counts_them(lm):
    import asyncio

    import httpx

    from batchlab.loadgen.prom import parse_metrics, value
    from batchlab.serve import ServerConfig, ServerThread

    reqs = task_requests("code_edit", 4, lm.tokenizer, 48)
    base, _ = serve(lm, reqs)
    config = ServerConfig(engine=EngineArgs(max_num_seqs=4, max_model_len=512), speculative_config=SPEC)

    async def stream(client, req):
        body = {"prompt": req.prompt_ids, "max_tokens": req.max_new_tokens, "temperature": 0, "stream": True,
                "stop_token_ids": list(req.stop_token_ids), "stream_options": {"continuous_usage_stats": True}}
        async with client.stream("POST", "/v1/completions", json=body) as r:
            return [json.loads(line[6:]) async for line in r.aiter_lines() if line.startswith("data: {")]

    async def go(url):
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120.0)) as client:
            return await asyncio.gather(*[stream(client, r) for r in reqs])

    with ServerThread(config, lm) as s:
        results = asyncio.run(go(s.url))
        metrics = parse_metrics(httpx.get(f"{s.url}/metrics", timeout=10).text)
    served = {r.request_id: chunks[-1]["batchlab"]["token_ids"] for r, chunks in zip(reqs, results)}
    assert_same_answers(lm, reqs, base, dict(zip(base, served.values())))
    counts = [[c["usage"]["completion_tokens"] for c in chunks] for chunks in results]
    steps = [b - a for cs in counts for a, b in zip(cs, cs[1:])]
    assert max(steps) > 1 and min(steps) >= 0                    # accepted drafts arrive in one chunk

    drafts, accepted = value(metrics, "vllm:spec_decode_num_drafts"), value(metrics, "vllm:spec_decode_num_accepted_tokens")
    assert drafts > 0 and 0 < accepted < value(metrics, "vllm:spec_decode_num_draft_tokens")
    per_pos = metrics[metrics["family"] == "vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert sorted(p["position"] for p in per_pos["labels"]) == ["0", "1", "2", "3"]
    assert per_pos["value"].sum() == accepted
    assert value(metrics, "vllm:generation_tokens") == sum(len(t) for t in served.values())


def test_the_server_refuses_speculation_it_cannot_do():
    from batchlab.serve import ServerConfig
    from batchlab.serve.__main__ import main

    with pytest.raises(ValueError, match="must come with policy='continuous'"):
        ServerConfig(policy="static", speculative_config=SPEC)
    with pytest.raises(ValueError, match="simulated device has no tokens"):
        ServerConfig(simulate="H100", speculative_config=SPEC)
    with pytest.raises(ValueError, match="method='eagle'"):
        ServerConfig(speculative_config=SpeculativeConfig.parse('{"method": "eagle", "num_speculative_tokens": 2}'))
    with pytest.raises(ValueError, match="'draft_model'; must be one of .'ngram', 'early_exit'. with the real model"):
        ServerConfig(speculative_config=SpeculativeConfig.parse('{"model": "Llama-3.2-1B", "num_speculative_tokens": 2}'))
    assert main(["--speculative-config", '{"num_speculative_tokens": 0}']) == 2


# --- the simulator: acceptance as a distribution per request, and the GPU's turn -------------------------
def test_acceptance_model_draws_as_stated_and_fits_back():
    from batchlab.speculative import AcceptanceModel, expected_accepted

    model = AcceptanceModel(0.6, concentration=1000.0, draft_rate=0.8, seed=3)
    checks, outputs = [], []
    for i in range(300):
        stream, cs, emitted = model.stream(f"r{i}"), [], 1
        for _ in range(40):
            if stream.drafts():
                a = stream.accepted(4)
                cs.append((4, a))
                emitted += a
            emitted += 1
        checks.append(cs)
        outputs.append(emitted)
    mean = sum(a for cs in checks for _, a in cs) / sum(len(cs) for cs in checks)
    assert abs(mean - expected_accepted(0.6, 4)) < 0.05
    fitted = AcceptanceModel.fit(checks, outputs)
    assert abs(fitted.rate - 0.6) < 0.02 and abs(fitted.draft_rate - 0.8) < 0.02 and fitted.concentration > 50
    assert model.stream("r7").alpha == model.stream("r7").alpha          # per request, reproducible


def test_the_simulator_predicts_where_speculation_stops_paying_on_a_gpu():
    from batchlab.sim import SimBackend
    from batchlab.steptime.roofline import RooflineCostModel
    from batchlab.experiments.speculation import crossover, serve_batches
    from batchlab.speculative import AcceptanceModel

    cost = RooflineCostModel.for_device("Llama-3-8B", "H100")
    acceptance = AcceptanceModel(0.6, draft_rate=0.8)

    def backend(spec, batch):
        return SimBackend(cost, 10**7, block_size=16, speculative_config=spec,
                          acceptance=acceptance if spec else None)

    def requests(n):
        return [Request(f"r{i}", None, 128, prompt_len=512) for i in range(n)]

    table, traces = serve_batches(backend, requests, [1, 16, 512], {"none": None, "ngram": SPEC}, min_requests=4)
    speedup = table[table["config"] == "ngram"].set_index("batch")["speedup"]
    assert speedup[1] > 1.5 and speedup[512] < 1.0                # free at batch 1, a loss in a full batch
    assert crossover(table, "ngram") == 512
    assert traces[1, "ngram"].requests[0].spec_checks
    sparse = AcceptanceModel(0.6, draft_rate=0.25)
    trace = Engine(ContinuousBatcher(4), SimBackend(cost, 10**7, speculative_config=SPEC, acceptance=sparse)).run(
        requests(4))
    samplings = sum(len(r.output_ids) - sum(a for _, a in r.spec_checks) - 1 for r in trace.requests)
    assert abs(sum(len(r.spec_checks) for r in trace.requests) / samplings - 0.25) < 0.06    # drafts as often as stated
    again, _ = serve_batches(backend, requests, [16], {"none": None, "ngram": SPEC}, rounds=2)
    assert again["tok_s"].tolist() == table[table["batch"] == 16]["tok_s"].tolist()      # seeded
    with pytest.raises(ValueError, match="rounds=0"):
        serve_batches(backend, requests, [16], {"none": None, "ngram": SPEC}, rounds=0)
    with pytest.raises(ValueError, match="needs an AcceptanceModel"):
        SimBackend(cost, 10**6, speculative_config=SPEC)
    from batchlab.steptime.cost_model import CostModel
    with pytest.raises(ValueError, match="method='early_exit' needs a cost model that knows the model's layers"):
        SimBackend(CostModel(0.01, 0.001, 0.001, 0.0), 10**6, speculative_config=EARLY_EXIT, acceptance=acceptance)
    with pytest.raises(ValueError, match="early_exit_layer=32; must be in 1..31"):
        SimBackend(cost, 10**6, speculative_config=replace(EARLY_EXIT, early_exit_layer=32), acceptance=acceptance)


def test_by_request_rate_a_poor_drafter_helps_a_light_load_and_hurts_a_heavy_one():
    from batchlab.sim import SimBackend
    from batchlab.steptime.roofline import RooflineCostModel
    from batchlab.experiments.speculation import serve_rates
    from batchlab.speculative import AcceptanceModel
    from batchlab.workloads import make_workload

    cost = RooflineCostModel.for_device("Llama-3-8B", "H100")

    def backend(spec):
        return SimBackend(cost, 10**7, block_size=16, speculative_config=spec,
                          acceptance=AcceptanceModel(0.2) if spec else None)

    runs = []
    table = serve_rates(backend, lambda rate: make_workload(200, prompt_len=512, output_len=128, rate=rate, seed=1),
                        [1, 32], {"none": None, "ngram": SPEC}, progress=lambda: runs.append(1))
    assert len(runs) == 4                                     # (2 rates) x (2 configs), each run told
    spec = table[table["config"] == "ngram"].set_index("rate")
    assert spec.loc[1, "tpot_speedup"] > 1.05 and spec.loc[32, "tpot_speedup"] < 0.9
    assert spec.loc[32, "mean_batch"] > 10 * spec.loc[1, "mean_batch"]
    with pytest.raises(ValueError, match="one config must be None"):
        serve_rates(backend, lambda rate: [], [1], {"ngram": SPEC})


def test_the_simulator_prices_an_early_exit_drafts_passes():
    """A pass of the first L layers costs what a step of a model of L layers costs, without the
    per-step overhead; deeper exits cost more for the same acceptance."""
    from batchlab.sim import SimBackend
    from batchlab.steptime.roofline import RooflineCostModel
    from batchlab.experiments.speculation import serve_batches
    from batchlab.speculative import AcceptanceModel

    cost = RooflineCostModel.for_device("Llama-3-8B", "H100")
    cut = cost.early_exit(8)
    assert cut.shape.num_layers == 8 and cut.overhead_s == 0
    assert 0.25 < cut.predict_features(1, 1, 600) / cost.roofline_seconds(1, 1, 600) < 0.5   # 8 of 32 layers, LM head

    def table(layer, alpha):
        def backend(spec, batch):
            return SimBackend(cost, 10**7, block_size=16, speculative_config=spec,
                              acceptance=AcceptanceModel(alpha) if spec else None)
        spec = replace(EARLY_EXIT, early_exit_layer=layer)
        t, _ = serve_batches(backend, lambda n: [Request(f"r{i}", None, 64, prompt_len=512) for i in range(n)],
                             [1, 64], {"none": None, "early_exit": spec}, min_requests=2)
        return t[t["config"] == "early_exit"].set_index("batch")["speedup"]

    shallow, deep, poor = table(8, 0.8), table(16, 0.8), table(8, 0.05)
    assert shallow[1] > 1.5 and deep[1] < shallow[1] and shallow[64] < shallow[1]
    assert poor[1] < 0.9                              # drafts that are hardly ever accepted only cost


def test_the_simulator_prices_a_draft_models_passes_as_vllm_runs_them():
    """A draft model keeps its own KV cache: its first pass runs over the whole step's tokens, then
    one token per drafting request per pass, each at the drafter's kernels with no CPU work; prompt
    lookup's drafts are free but vLLM turns async scheduling off for them."""
    from batchlab.sim import SimBackend
    from batchlab.experiments.speculation import serve_batches
    from batchlab.plan import decode_split, step_features
    from batchlab.speculative import AcceptanceModel
    from batchlab.vllm_sim import VllmReplica

    cost = VllmReplica("Llama-3-8B", "H100").step_model
    draft = cost.draft_model("Llama-3.2-1B")
    assert draft.gpu.shape.name == "Llama-3.2-1B" and draft.cpu_seconds(64) == 0
    assert 0.1 < draft.predict_features(1, 1, 600) / cost.predict_features(1, 1, 600) < 0.5
    with pytest.raises(ValueError, match="Llama-3-8B's vocabulary of 128256 tokens .SmolLM2-135M has 49152"):
        cost.draft_model("SmolLM2-135M")
    backend = SimBackend(cost, 10**6, block_size=16, speculative_config=DRAFT_MODEL, acceptance=AcceptanceModel(0.7))
    assert backend.cost_model.async_scheduling
    assert not SimBackend(cost, 10**6, speculative_config=SPEC, acceptance=AcceptanceModel(0.7)).cost_model.async_scheduling

    # Every step's duration, rebuilt from its chunks and the next step's drafts.
    trace = Engine(ContinuousBatcher(4), backend).run([Request(f"r{i}", None, 40, prompt_len=300 + 50 * i)
                                                       for i in range(3)])
    steps = trace.steps
    for s, after in zip(steps, steps[1:] + [None]):
        want = cost.predict_split(*step_features(s.chunks), *decode_split(s.chunks))
        want += draft.predict_features(*step_features(s.chunks))
        drafts = [] if after is None else [(c.start + 1, len(c.draft)) for c in after.chunks if c.draft]
        for j in range(1, max((room for _, room in drafts), default=0)):
            contexts = [context + j for context, room in drafts if room > j]
            want += draft.predict_features(len(contexts), len(contexts), sum(contexts))
        assert s.duration == pytest.approx(want, rel=1e-9), s.index

    def speedups(spec, alpha):
        def make(config, batch):
            return SimBackend(cost, 10**7, block_size=16, speculative_config=config,
                              acceptance=AcceptanceModel(alpha) if config else None)
        t, _ = serve_batches(make, lambda n: [Request(f"r{i}", None, 64, prompt_len=512) for i in range(n)],
                             [1, 64], {"none": None, "spec": spec}, min_requests=2)
        return t[t["config"] == "spec"].set_index("batch")["speedup"]

    free, drafted = speedups(SPEC, 0.8), speedups(DRAFT_MODEL, 0.8)
    assert 1.2 < drafted[1] < free[1] and drafted[64] < free[64]    # the drafter's passes cost time
    assert speedups(DRAFT_MODEL, 0.1)[1] < 0.9                      # and rarely-right drafts only cost
    from batchlab.steptime.roofline import RooflineCostModel
    with pytest.raises(ValueError, match="needs a cost model that prices another model's kernels"):
        SimBackend(RooflineCostModel.for_device("Llama-3-8B", "H100"), 10**6, speculative_config=DRAFT_MODEL,
                   acceptance=AcceptanceModel(0.7))
