"""Worked solutions for notebook 13 (tuning vLLM)."""

from batchlab.engine_args import EngineArgs
from batchlab.loadgen.predict import load_figures, simulate_load


def hit_tokens(prompt_len: int, shared_len: int, block_size: int) -> int:
    """13.1: the cache holds whole blocks only, and the prompt's last token is always computed
    (its logits give the first output token), so at most prompt_len - 1 tokens can come from it."""
    return (min(shared_len, prompt_len - 1) // block_size) * block_size


def predicted_throughput(cost, requests, max_num_seqs: int) -> float:
    """The load on the simulator with vLLM's CPU defaults except max_num_seqs: output tokens/s."""
    return load_figures(simulate_load(cost, requests, EngineArgs(max_num_seqs=max_num_seqs)))["output_tok_s"]


def seqs_to_keep_up(cost, requests, share: float, candidates=(1, 2, 4, 8, 16, 32, 64, 128)) -> int:
    """13.2: the smallest candidate whose predicted throughput reaches ``share`` of the largest's."""
    tput = {k: predicted_throughput(cost, requests, k) for k in candidates}
    return min(k for k in candidates if tput[k] >= share * tput[max(candidates)])


def _wrong_hit_tokens(prompt_len: int, shared_len: int, block_size: int) -> int:
    """Counts partial blocks too, and forgets the last-token rule."""
    return min(shared_len, prompt_len)


def _wrong_seqs(cost, requests, share: float) -> int:
    """Stops at the first doubling that adds less than 1 - share, comparing with the setting
    before instead of with 128."""
    candidates = (1, 2, 4, 8, 16, 32, 64, 128)
    tput = [predicted_throughput(cost, requests, k) for k in candidates]
    for k, before, now in zip(candidates, tput, tput[1:]):
        if now < before / share:
            return k
    return candidates[-1]


SOLUTIONS = {"13.1": lambda: hit_tokens, "13.2": lambda: seqs_to_keep_up}
WRONG = {"13.1": _wrong_hit_tokens, "13.2": _wrong_seqs}
