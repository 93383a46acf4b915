"""One load client for any OpenAI-compatible server (batchlab's, vLLM's, or anyone's).

- ``client.py``: ``run_load`` (open or closed loop, streaming, bounded) and ``LoadResult``.
- ``records.py``: ``ClientRecord`` per request and the ``Trace`` built from the records, so every
  metric, plot and notebook function works on client-side data unchanged.
- ``prompts.py``: prompts from a JSONL file (completions or chat), arrival times, text prompts.
- ``datasets.py``: ``vllm bench serve``'s datasets (``random``, ``sharegpt``, ``prefix_repetition``).
- ``schedule.py``: send times as vLLM plans them (gamma gaps rescaled so the last send is at
  N / rate; linear or exponential ramp-ups).
- ``vllm_result.py``: a load as ``vllm bench serve``'s result JSON (its keys and units), and
  ``read_result``, which reads a file of either client.
- ``sweep.py``: SLOs in vLLM's ``--goodput`` form, and a sweep over request rates with DistServe's
  goodput at the end.
- ``calibrate.py``: the course's cost model fitted from outside a server (lone prompts, concurrent decodes).
- ``predict.py``: a load predicted on the simulator under a server's knobs, beside what was measured.
- ``prom.py``: any server's ``/metrics`` (batchlab's or vLLM's) as a DataFrame; histogram
  quantiles; a gauge sampler that scrapes during a load.
- ``soak.py``: a long mixed load (streams, aborts, bad requests) for a server's memory and end states.
- ``__main__.py``: the command line, with ``vllm bench serve``'s flags.

From a notebook::

    reqs = plan_requests(32, prompt_len=64, output_len=16, tokenizer=tok, arrival="poisson", rate=2.0)
    result = run_load(server.url, reqs)             # open loop at each request's arrival_time
    result.table()                                  # ttft / tpot / itl / e2e from the client's side
    result.rate_report()                            # did the client keep to its plan?

From a shell: ``python -m batchlab.loadgen --base-url http://127.0.0.1:8000 --request-rate 2 --num-prompts 32``
(``--save-result`` writes vLLM's result JSON).
"""

from __future__ import annotations

from batchlab.loadgen.client import ENDPOINTS, MODES, LoadRequest, LoadResult, from_workload, run_load, run_load_async
from batchlab.loadgen.prompts import as_text, read_prompts, with_arrivals
from batchlab.loadgen.records import ClientRecord, chunk_gaps, client_trace, server_trace
from batchlab.loadgen.sweep import parse_goodput, parse_rates, rate_sweep
from batchlab.loadgen.vllm_result import BenchResult, read_result
from batchlab.requests import Request


def plan_requests(n: int, prompt_len: int, output_len: int, tokenizer, arrival: str = "poisson",
                  rate: float | None = None, burstiness: float = 1.0, seed: int = 0,
                  id_prefix: str = "r") -> list[LoadRequest]:
    """``n`` requests with corpus prompts of exactly ``prompt_len`` tokens (the course's tokenizer)
    and ``output_len`` output tokens, arriving by ``arrival`` (see ``batchlab.workloads``). A prompt's
    text comes from its request id: give loads sent to one server other ``id_prefix`` es, so that a
    prefix cache does not serve one load from another's prompts."""
    from batchlab.workloads import make_workload
    return from_workload(make_workload(n, prompt_len=prompt_len, output_len=output_len, arrival=arrival,
                                       rate=rate, burstiness=burstiness, seed=seed, tokenizer=tokenizer,
                                       id_prefix=id_prefix))


def replay_requests(path: str, tokenizer) -> list[LoadRequest]:
    """A workload file's requests (``data/*.jsonl``) with its arrival times, prompts rebuilt from
    the corpus with ``tokenizer`` where the file has no prompt ids."""
    from batchlab.workloads import load_workload
    return from_workload(load_workload(path, tokenizer))


def course_tokenizer():
    """The course model's tokenizer, from the converted cache (converting the model once if needed)."""
    from transformers import AutoTokenizer

    from batchlab.model import load_model
    from batchlab.model.loading import _cache_is_complete, converted_dir
    folder = converted_dir()
    if not _cache_is_complete(folder):
        return load_model().tokenizer
    return AutoTokenizer.from_pretrained(folder)


__all__ = ["LoadRequest", "LoadResult", "ClientRecord", "run_load", "run_load_async", "from_workload",
           "plan_requests", "replay_requests", "course_tokenizer", "client_trace", "server_trace",
           "chunk_gaps", "MODES", "ENDPOINTS", "Request", "read_prompts", "with_arrivals", "as_text",
           "parse_goodput", "parse_rates", "rate_sweep", "BenchResult", "read_result"]
