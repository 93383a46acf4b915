"""batchlab.model.generate (the one-prompt greedy loop) and batchlab.model.environment (the machine report)."""

import pytest
import torch

from batchlab.model.environment import device_name, environment_report
from batchlab.model.generate import greedy_generate


def test_greedy_generate_matches_transformers(lm, weights):
    prompt = lm.chat_ids("What is the capital of France?")
    gen = greedy_generate(weights, prompt, max_new_tokens=6)
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        ref = lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=6, pad_token_id=0)
    assert gen.output_ids == ref[0, len(prompt):].tolist()
    assert len(gen.step_seconds) == 6 and all(t > 0 for t in gen.step_seconds)
    assert gen.prefill_seconds == gen.step_seconds[0] and len(gen.decode_seconds) == 5


def test_greedy_generate_stops_after_a_stop_token(lm, weights):
    prompt = lm.chat_ids("What is the capital of France?")
    first = greedy_generate(weights, prompt, max_new_tokens=3).output_ids
    stopped = greedy_generate(weights, prompt, max_new_tokens=3, stop_token_ids=[first[1]])
    assert stopped.output_ids == first[:2], "generation ends right after the stop token, keeping it"


@pytest.mark.parametrize("prompt, max_new, message", [
    ([], 4, r"prompt_ids=\[\]; must be a non-empty list of token ids"),
    ([1, 2], 0, "max_new_tokens=0; must be an int >= 1"), ([1, 2], True, "max_new_tokens=True")])
def test_greedy_generate_rejects_bad_arguments(weights, prompt, max_new, message):
    with pytest.raises(ValueError, match=message):
        greedy_generate(weights, prompt, max_new)


def test_environment_report_describes_this_machine():
    report = environment_report("cpu")
    assert report["device"] == "cpu" and report["torch"] == torch.__version__
    assert report["torch_threads"] == torch.get_num_threads() >= 1
    assert report["cpu_cores_usable"] >= 1
    assert device_name("cpu").startswith("CPU")
