"""Worked solutions for notebook 13 (tuning vLLM)."""

from batchlab.loadgen.predict import load_figures, simulate_load


def hit_tokens(prompt_len: int, shared_len: int, block_size: int) -> int:
    """13.1: the cache holds whole blocks only, and the prompt's last token is always computed
    (its logits give the first output token), so at most prompt_len - 1 tokens can come from it."""
    return (min(shared_len, prompt_len - 1) // block_size) * block_size


def predicted_throughput(cost, requests, max_num_seqs: int) -> float:
    """13.2: the load on the simulator with vLLM's CPU defaults except max_num_seqs."""
    return load_figures(simulate_load(cost, requests, max_num_seqs=max_num_seqs))["output_tok_s"]


def _wrong_hit_tokens(prompt_len: int, shared_len: int, block_size: int) -> int:
    """Counts partial blocks too, and forgets the last-token rule."""
    return min(shared_len, prompt_len)


def _wrong_throughput(cost, requests, max_num_seqs: int) -> float:
    """One request at a time whatever max_num_seqs says."""
    return load_figures(simulate_load(cost, requests, max_num_seqs=1))["output_tok_s"]


SOLUTIONS = {"13.1": lambda: hit_tokens, "13.2": lambda: predicted_throughput}
WRONG = {"13.1": _wrong_hit_tokens, "13.2": _wrong_throughput}
