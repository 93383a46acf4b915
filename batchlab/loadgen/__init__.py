"""One load client for any OpenAI-compatible server (batchlab's, vLLM's, or anyone's).

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

from batchlab.loadgen.client import (ENDPOINTS, MODES, LoadRequest, LoadResult, from_workload,
                                     run_load, run_load_async)
from batchlab.loadgen.prompts import as_text, read_prompts, with_arrivals
from batchlab.loadgen.records import ClientRecord, chunk_gaps, client_trace, server_trace
from batchlab.loadgen.sweep import parse_goodput, parse_rates, rate_sweep
from batchlab.loadgen.vllm_result import BenchResult, read_result
from batchlab.requests import Request


def plan_requests(n: int, prompt_len: int, output_len: int, tokenizer, arrival: str = "poisson",
                  rate: float | None = None, burstiness: float = 1.0, seed: int = 0,
                  id_prefix: str = "r") -> list[LoadRequest]:
    """``n`` requests with corpus prompts of exactly ``prompt_len`` tokens (the course's tokenizer)
    and ``output_len`` output tokens, arriving by ``arrival`` (see ``batchlab.workloads``). A
    prompt's text comes from its request id: give loads sent to one server other ``id_prefix`` es,
    so that a prefix cache does not serve one load from another's prompts."""
    from batchlab.workloads import make_workload
    return from_workload(make_workload(n, prompt_len=prompt_len, output_len=output_len,
                                       arrival=arrival, rate=rate, burstiness=burstiness, seed=seed,
                                       tokenizer=tokenizer, id_prefix=id_prefix))


def replay_requests(path: str, tokenizer) -> list[LoadRequest]:
    """A workload file's requests (``data/*.jsonl``) with its arrival times, prompts rebuilt from
    the corpus with ``tokenizer`` where the file has no prompt ids."""
    from batchlab.workloads import load_workload
    return from_workload(load_workload(path, tokenizer))


def course_tokenizer():
    """The course model's tokenizer, from the converted cache (converting the model once if
    needed)."""
    from transformers import AutoTokenizer

    from batchlab.model import load_model
    from batchlab.model.loading import _cache_is_complete, converted_dir
    folder = converted_dir()
    if not _cache_is_complete(folder):
        return load_model().tokenizer
    return AutoTokenizer.from_pretrained(folder)


__all__ = ["LoadRequest", "LoadResult", "ClientRecord", "run_load", "run_load_async",
           "from_workload",
           "plan_requests", "replay_requests", "course_tokenizer", "client_trace", "server_trace",
           "chunk_gaps", "MODES", "ENDPOINTS", "Request", "read_prompts", "with_arrivals",
           "as_text", "parse_goodput", "parse_rates", "rate_sweep", "BenchResult", "read_result"]
