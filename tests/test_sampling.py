"""vLLM's sampling parameters in batchlab's sampler: penalties, min_tokens, logit_bias, min_p,
top_k, logprobs; each checked against its definition, and on the real model in a batch."""

from __future__ import annotations

import math

import pytest
import torch

from batchlab.model.sampling import RequestSampler, apply_penalties, filtered_probs, token_logprobs
from batchlab.requests import Request, SamplingParams


def req(rid: str = "r", prompt=(1, 2), output=(), max_new: int = 8, stops=(), **params) -> Request:
    r = Request(rid, list(prompt), max_new, sampling=SamplingParams(**params), stop_token_ids=stops)
    r.output_ids = list(output)
    return r


def test_penalties_follow_vllms_formula():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0])
    r = req(prompt=[0], output=[1, 1, 3], repetition_penalty=2.0, frequency_penalty=0.25, presence_penalty=0.5)
    got = apply_penalties(logits.clone(), r)
    # token 0: in the prompt, positive -> / 2; 1: twice in the output, negative -> * 2, then - 2 * 0.25 - 0.5;
    # 3: once -> / 2 - 0.25 - 0.5; 2 and 4: untouched
    want = torch.tensor([1.0, -2.0 - 0.5 - 0.5, 0.5, 1.5 - 0.25 - 0.5, -2.0])
    assert torch.allclose(got, want)
    assert torch.equal(apply_penalties(logits.clone(), req(output=[1, 3])), logits)   # all off


def test_min_tokens_keeps_stop_tokens_out_until_then():
    logits = torch.tensor([[0.0, 5.0, 1.0]])
    sampler = RequestSampler()
    early = req(output=[2], stops=(1,), min_tokens=2)
    assert sampler.sample(logits, [early])[0] == [2]          # the stop token 1 is masked
    ready = req(output=[2, 2], stops=(1,), min_tokens=2)
    assert sampler.sample(logits, [ready])[0] == [1]
    assert sampler.sample(logits, [req(logit_bias=((0, 10.0),))])[0] == [0]


def test_min_p_and_top_k_drop_unlikely_tokens():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = filtered_probs(logits, SamplingParams(temperature=1.0, min_p=0.2))     # < 0.1 dropped
    assert torch.allclose(probs, torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95)
    probs = filtered_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    same = filtered_probs(logits, SamplingParams(temperature=1.0))
    assert torch.allclose(same, torch.tensor([0.5, 0.3, 0.15, 0.05]))


def test_sampled_tokens_stay_inside_the_filters():
    torch.manual_seed(0)
    logits = torch.randn(1, 200)
    top5 = set(logits[0].topk(5).indices.tolist())
    sampler = RequestSampler()
    drawn = {sampler.sample(logits, [req(f"r{i}", temperature=1.5, top_k=5, seed=i)])[0][0] for i in range(60)}
    assert drawn <= top5 and len(drawn) > 1


def test_logprobs_are_the_raw_distributions_with_rank_and_top():
    logits = torch.tensor([1.0, 3.0, 2.0, 0.0])
    lp = token_logprobs(logits, token=2, num_top=2)
    exact = torch.log_softmax(logits, -1)
    assert lp.token_id == 2 and math.isclose(lp.logprob, float(exact[2]), rel_tol=1e-6) and lp.rank == 2
    assert [t for t, _ in lp.top] == [1, 2] and math.isclose(lp.top[0][1], float(exact[1]), rel_tol=1e-6)
    # penalties change the choice, not the logprobs (vLLM's raw_logprobs)
    tokens, lps = RequestSampler().sample(logits[None], [req(output=[1], frequency_penalty=2.0, logprobs=1)])
    assert tokens == [2] and lps["r"].rank == 2 and lps["r"].top[0][0] == 1


def test_bad_sampling_values_name_the_field():
    for kwargs, name in (({"top_k": -1}, "top_k"), ({"min_p": 1.5}, "min_p"), ({"presence_penalty": 3}, "presence"),
                         ({"repetition_penalty": 0}, "repetition_penalty"), ({"min_tokens": -1}, "min_tokens"),
                         ({"logprobs": -1}, "logprobs"), ({"logit_bias": {1: 2.0}}, "logit_bias")):
        with pytest.raises(ValueError, match=name):
            SamplingParams(**kwargs)
    with pytest.raises(ValueError, match="min_tokens=9; must be at most max_new_tokens=4"):
        Request("r", [1], 4, sampling=SamplingParams(min_tokens=9))


def test_penalized_greedy_is_the_same_alone_and_in_a_batch_and_min_tokens_holds(lm):
    """On the real model in fp32: the logit processors work per request, so batching leaves them alone."""
    from batchlab.backends import ModelBackend
    from batchlab.engine import Engine
    from batchlab.schedulers import ContinuousBatcher
    if lm.dtype != "float32":
        pytest.skip("the equality is fp32's")
    tok = lm.tokenizer
    eos = tok.eos_token_id
    texts = ["Say hi.", "One, two, three,", "Answer yes or no: is water wet?", "Write a list:"]
    settings = [SamplingParams(repetition_penalty=1.3), SamplingParams(frequency_penalty=0.8, presence_penalty=0.4),
                SamplingParams(min_tokens=12, logprobs=2), SamplingParams(temperature=0.9, top_k=20, min_p=0.05, seed=3)]

    def make():
        return [Request(f"q{i}", tok(t)["input_ids"], 16, sampling=p, stop_token_ids=(eos,))
                for i, (t, p) in enumerate(zip(texts, settings))]

    def run(requests: list[Request], batch: int) -> list[Request]:
        engine = Engine(ContinuousBatcher(max_num_seqs=batch), ModelBackend(lm, num_slots=batch, max_seq_len=64))
        engine.run(requests)
        return list(engine.requests.values())       # the engine's own copies, with their outputs

    together = run(make(), 4)
    alone = [run([r], 1)[0] for r in make()]
    for a, b in zip(together, alone):
        assert a.output_ids == b.output_ids and len(a.output_ids) > 1, a.request_id
    plain = run([Request(f"p{i}", tok(texts[i])["input_ids"], 16, stop_token_ids=(eos,)) for i in (0, 2)], 2)
    assert plain[0].output_ids != together[0].output_ids    # the penalty changed the greedy answer
    assert len(plain[1].output_ids) < 12 and plain[1].output_ids[-1] == eos    # alone it stops early...
    assert len(together[2].output_ids) >= 12 and eos not in together[2].output_ids[:12]   # ...not before min_tokens
    assert len(together[2].output_logprobs) == len(together[2].output_ids)
