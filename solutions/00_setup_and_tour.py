"""Worked solutions for notebook 00 (setup and tour)."""

from batchlab.model import load_model
from batchlab.model.generate import greedy_generate
from batchlab.model.llama import LlamaWeights


def solve_00_1() -> str:
    """Ask the Japan question with the greedy loop, stop at the end-of-turn token, decode."""
    lm = load_model(dtype="float32")          # notebook 00 loads the model in fp32
    weights = LlamaWeights.from_hf(lm.model)
    prompt_ids = lm.chat_ids("What is the capital of Japan?")
    gen = greedy_generate(weights, prompt_ids, max_new_tokens=16,
                          stop_token_ids=[lm.tokenizer.eos_token_id])
    return lm.decode(gen.output_ids)          # "The capital of Japan is Tokyo."


SOLUTIONS = {"00.1": solve_00_1}
WRONG = {"00.1": "The capital of Japan is Kyoto."}
