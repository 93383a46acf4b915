"""vLLM's offline engine (``LLM.generate``) on the benchmark's prompts: run by vLLM's own python.

    .venv-vllm/bin/python benchmarks/peer/vllm_offline_worker.py JOB.json RESULT.json

This file is executed as a script by the python of vLLM's venv (``benchmarks.peer.vllm_contender`` starts it
as a subprocess), never imported into the course's process, so it imports only vLLM and the
standard library. ``JOB.json`` holds the model folder, the dtype, the engine budgets and the
prompts as token ids (tokenized once, by the course, so every contender sees the same tokens);
``RESULT.json`` gets every request's output token ids and times.

- Greedy (``temperature=0``), exact lengths: ``ignore_eos=True`` and ``max_tokens`` = the
  request's ``max_new_tokens``, as for every other contender.
- Timed: only the ``generate`` call over the whole workload, after the engine is built and
  warmed up on the two warm-up requests (model loading and start-up are not counted).
- Per-request times come from vLLM's own request stats (``RequestOutput.metrics``, filled in
  when stats logging is on: ``disable_log_stats=False``): the engine core's monotonic time of
  the first and of the last token. ``LLM.generate`` returns only at the end, so these are the
  engine's view (like batchlab's offline virtual clock), not what a caller of ``generate`` saw.
  Where ``metrics`` is missing, the result says so and no TTFT is reported.
- CPU seconds: user + system time of this process and every process it started (the engine
  core runs in a child process), read from ``/proc`` before and after the timed call.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _cpu_seconds_of_tree(root_pid: int) -> float | None:
    """utime + stime (seconds) of ``root_pid`` and all its descendants, from ``/proc`` (Linux)."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
        parent, ticks = {}, {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            # after "pid (comm)": state ppid ... utime (field 14) stime (15), 1-based in proc(5)
            parent[int(entry)] = int(fields[1])
            ticks[int(entry)] = int(fields[11]) + int(fields[12])
    except (OSError, ValueError, AttributeError):
        return None
    return sum(ticks.get(pid, 0) for pid in _process_tree(root_pid, parent)) / tick


def _process_tree(root_pid: int, parent: dict[int, int] | None = None) -> set[int]:
    """``root_pid`` and all its descendants (``parent``: pid -> ppid, read from ``/proc`` if None)."""
    if parent is None:
        parent = {}
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, frontier = {root_pid}, [root_pid]
    while frontier:
        pid = frontier.pop()
        for child, ppid in parent.items():
            if ppid == pid and child not in tree:
                tree.add(child)
                frontier.append(child)
    return tree


def _peak_rss_of_tree(root_pid: int) -> int | None:
    """Sum of ``VmHWM`` (peak resident bytes) of this process and its descendants (weights included)."""
    total, found, tree = 0, False, _process_tree(root_pid)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(entry) in tree:
            if "VmHWM" in status:
                total += int(status["VmHWM"].split()[0]) * 1024
                found = True
    return total if found else None


def _prompts(ids_list: list[list[int]]):
    from vllm.inputs import TokensPrompt

    return [TokensPrompt(prompt_token_ids=list(ids)) for ids in ids_list]


def _params(lengths: list[int]):
    from vllm import SamplingParams

    return [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]


def main(job_path: str, result_path: str) -> None:
    with open(job_path) as f:
        job = json.load(f)
    import vllm
    from vllm import LLM

    t_load = time.perf_counter()
    llm = LLM(model=job["model_dir"], dtype=job["dtype"], max_num_seqs=job["max_num_seqs"],
              max_num_batched_tokens=job["max_num_batched_tokens"], max_model_len=job["max_model_len"],
              enforce_eager=job["enforce_eager"], enable_prefix_caching=job["enable_prefix_caching"],
              disable_log_stats=False, seed=0,
              gpu_memory_utilization=job.get("gpu_memory_utilization", 0.5))
    load_seconds = time.perf_counter() - t_load
    if job["warmup_prompts"]:
        llm.generate(_prompts(job["warmup_prompts"]), _params(job["warmup_lengths"]), use_tqdm=False)

    prompts, params = _prompts(job["prompts"]), _params(job["max_tokens"])
    pid = os.getpid()
    c0 = _cpu_seconds_of_tree(pid)
    t0_mono, t0 = time.monotonic(), time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    c1 = _cpu_seconds_of_tree(pid)

    requests, have_metrics = [], True
    for out in outputs:
        m = getattr(out, "metrics", None)
        first = getattr(m, "first_token_ts", 0.0) if m is not None else 0.0
        last = getattr(m, "last_token_ts", 0.0) if m is not None else 0.0
        if not first or not last:
            have_metrics = False
        requests.append({
            "output_ids": [int(t) for t in out.outputs[0].token_ids],
            "finish_reason": out.outputs[0].finish_reason,
            # engine core timestamps (time.monotonic, shared across processes on Linux) - t0
            "first_token_s": first - t0_mono if first else None,
            "last_token_s": last - t0_mono if last else None,
        })
    result = {"vllm_version": vllm.__version__, "wall_seconds": wall, "load_seconds": load_seconds,
              "cpu_seconds": None if c0 is None or c1 is None else c1 - c0,
              "peak_rss_bytes_with_weights": _peak_rss_of_tree(pid),
              "have_request_metrics": have_metrics, "requests": requests}
    with open(result_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: vllm_offline_worker.py JOB.json RESULT.json")
    main(sys.argv[1], sys.argv[2])
