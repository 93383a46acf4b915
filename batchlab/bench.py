"""Benchmark: batchlab's engines against what a user would otherwise run, on one workload, in one run.

    python -m batchlab.bench                          # offline: 32 requests, all at t = 0
    python -m batchlab.bench --mode online --rate 2   # online: Poisson arrivals on the wall clock
    python -m batchlab.bench --tiny                   # a few requests, a few tokens (the test runs this)

One fixed, seeded workload (``make_workload(n, "chat", scale="cpu")``: mixed prompt and output
lengths, greedy, every request makes exactly ``max_new_tokens`` tokens) is served, one after the
other in this process, by each *contender* on the same model (SmolLM2-135M, fp32):

==========================  =================================================================
``hf_sequential``           transformers ``generate``, one request at a time, in arrival order
``hf_static``               transformers ``generate``, batches of 8 in arrival order, left padding
``hf_continuous``           transformers' own continuous batching (``ContinuousBatchingManager``),
                            with enough KV blocks for every request at once, tried at a few
                            ``max_batch_tokens``; the fastest try is the reference
``batchlab_static``         ``Engine(StaticBatcher(8), ModelBackend)``
``batchlab_dynamic``        ``Engine(DynamicBatcher(8, timeout), ModelBackend)``
``batchlab_continuous``     ``Engine(ContinuousBatcher(max_num_seqs, max_batched_tokens), ModelBackend)``
==========================  =================================================================

Rules that keep the comparison fair (each one is a decision; the reasons are in the code):

- **Same tokens.** Greedy everywhere, and nobody stops at EOS: batchlab requests have no stop
  tokens; ``generate`` gets ``eos_token_id=None`` (passed as a keyword: a ``GenerationConfig``
  with ``eos_token_id=None`` is silently refilled with the model's EOS); the manager gets
  ``eos_token_id=-1`` ("none"). ``min_new_tokens`` is not used: it masks the EOS logit and can
  change the argmax. ``generate`` always gets an explicit attention mask (otherwise it masks
  every prompt token equal to the pad id, which here is also EOS). Every request's tokens are
  compared with ``batchlab_continuous``'s; mismatches are reported with the first differing
  position, never hidden (left padding can legitimately move fp32 results a little).
- **Same clock.** Every contender is warmed up on two tiny requests first, then timed. Throughput
  is useful output tokens (each request's ``max_new_tokens``; padding and tokens a static batch
  computes past a request's end do not count) divided by wall seconds measured around the timed
  call. Offline, batchlab runs on its virtual clock (time advances by each measured step, which
  equals wall time when everything arrives at t = 0); its TTFT and E2E come from that clock, and
  the wall time around ``Engine.run`` (which includes all Python overhead) gives its throughput,
  like everyone else's. Online, batchlab runs on the wall clock.
- **Same arrivals.** Online, requests arrive at the workload's Poisson times on the wall clock:
  ``generate`` contenders wait for them (a static batch waits until its 8 members have arrived);
  the manager is fed by a thread that calls ``add_request`` at each arrival time; batchlab uses
  ``Engine(clock="wall")``. Latencies are measured from the scheduled arrival time.
- **What the client sees.** ``hf_sequential`` streams (its per-token times come from a streamer);
  ``hf_static`` returns each batch at once (TTFT = E2E, as for any non-streamed ``generate``),
  like batchlab's static and dynamic batchers (non-streaming by default); both continuous
  batchers stream (the manager's per-token ``timestamps``).
- **Peak memory** is the highest resident set size (RSS) during a contender's setup, warm-up and
  run, minus the RSS just before it began: the model weights, loaded once and shared, are not
  counted; KV caches, batchlab's fused weight copies, activations and Python objects are. On
  Linux it is read exactly from ``VmHWM`` after resetting it (``/proc/self/clear_refs``); elsewhere
  a thread samples RSS with ``psutil`` every 2 ms. Freed heap memory is returned to the OS
  (``malloc_trim``) before each contender so one contender's leftovers do not hide the next one's
  growth. ``tracemalloc`` is not used: it slows every Python allocation, which would distort the
  timing, and it does not see tensor memory anyway.
- **A shared machine.** Wall time depends on how much of the cores the process gets, so each
  contender also reports the CPU seconds the process used (``tok/CPU-s``): the work it needed,
  whatever its share of the cores. The header prints ``os.getloadavg()``. When other jobs load
  the cores, ``--threads 1`` keeps torch's thread pool from waiting on preempted peers (on a
  2-core machine with a load of 12, two threads made every step several times slower).

Where the time goes: every run prints how long the model steps took against the wall time (the
rest is the engine's own work), and ``--profile`` adds the share of torch op time spent in
matmuls, attention, copies and the rest. Offline, it also prints this machine's limits: the
fastest any engine could serve the workload with these fp32 weights (``machine_limits``), and so
how much faster than transformers' continuous batching anyone could possibly be.

The JSON written next to the printed table (``--out``) holds the machine, the exact command, the
workload, every contender's metrics, settings, per-request tokens and timings, every
``max_batch_tokens`` try, the greedy agreement and the goal check.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import math
import os
import platform
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from . import metrics
from .requests import Request, RequestStatus
from .trace import RequestRecord, Trace
from .workloads import Range, make_workload

HF_CONTENDERS = ("hf_sequential", "hf_static", "hf_continuous")
BATCHLAB_CONTENDERS = ("batchlab_static", "batchlab_dynamic", "batchlab_continuous")
CONTENDERS = HF_CONTENDERS + BATCHLAB_CONTENDERS
REFERENCE = "hf_continuous"          # ratios are "contender / this"
GREEDY_REFERENCE = "batchlab_continuous"   # token agreement is checked against this
MODES = ("offline", "online")

LABELS = {
    "hf_sequential": "transformers generate, 1 at a time",
    "hf_static": "transformers generate, static batches",
    "hf_continuous": "transformers continuous batching",
    "batchlab_static": "batchlab static",
    "batchlab_dynamic": "batchlab dynamic",
    "batchlab_continuous": "batchlab continuous",
}

# The goal from the project's issue, on the offline workload (2-core CPU, fp32).
GOAL_THROUGHPUT_RATIO = 4.0     # batchlab continuous throughput >= 4x transformers' continuous batching
GOAL_TTFT_RATIO = 1 / 3         # and TTFT p50 <= 1/3 of it

TINY = {"num_requests": 4, "prompt_len": Range(6, 20), "output_len": Range(2, 5), "hf_batch_tokens": (64,)}


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True)
class BenchConfig:
    """What to run.

    ``mode``: ``"offline"`` (every request at t = 0) or ``"online"`` (Poisson arrivals at ``rate``
    requests/s, served on the wall clock). ``num_requests``, ``seed``, ``preset``: the workload
    (``make_workload(num_requests, preset, scale="cpu", seed=seed)``). ``only``: contenders to run.
    ``batch_size``: the static/dynamic batch size (transformers' static batches too).
    ``dynamic_timeout``: seconds the dynamic batcher waits for a batch to fill.
    ``max_num_seqs`` / ``max_batched_tokens``: batchlab's continuous batcher budgets.
    ``hf_batch_tokens``: the ``max_batch_tokens`` values tried for transformers' continuous batching.
    ``hf_page_size``: tokens per page of its paged KV cache. ``tiny``: a few requests and tokens
    (``TINY``), for the test. ``warmup``: run two tiny requests through each contender first.
    ``threads``: torch CPU threads for every contender (None: leave the process's setting).
    ``profile``: record each timed run's torch ops (``OpProfile``); adds some overhead.
    """

    mode: str = "offline"
    num_requests: int = 32
    rate: float = 2.0
    seed: int = 0
    preset: str = "chat"
    only: tuple[str, ...] = CONTENDERS
    batch_size: int = 8
    dynamic_timeout: float = 0.1
    max_num_seqs: int = 32
    max_batched_tokens: int = 512
    hf_batch_tokens: tuple[int, ...] = (64, 128, 256, 512)
    hf_page_size: int = 64
    tiny: bool = False
    warmup: bool = True
    threads: int | None = None
    profile: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r}; allowed: {', '.join(MODES)}")
        if not _positive_int(self.num_requests):
            raise ValueError(f"num_requests={self.num_requests!r}; must be an int >= 1")
        if isinstance(self.rate, bool) or not isinstance(self.rate, (int, float)) \
                or not math.isfinite(self.rate) or self.rate <= 0:
            raise ValueError(f"rate={self.rate!r}; must be a finite number of requests/s > 0")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r}; must be an int >= 0")
        unknown = [c for c in self.only if c not in CONTENDERS]
        if unknown or not self.only:
            raise ValueError(f"only={self.only!r}: unknown {unknown}; choose from {', '.join(CONTENDERS)}")
        if self.threads is not None and not _positive_int(self.threads):
            raise ValueError(f"threads={self.threads!r}; must be an int >= 1 or None (every core)")
        for name in ("batch_size", "max_num_seqs", "max_batched_tokens", "hf_page_size"):
            if not _positive_int(getattr(self, name)):
                raise ValueError(f"{name}={getattr(self, name)!r}; must be an int >= 1")
        if not self.hf_batch_tokens or not all(_positive_int(t) for t in self.hf_batch_tokens):
            raise ValueError(f"hf_batch_tokens={self.hf_batch_tokens!r}; must be one or more ints >= 1")
        if isinstance(self.dynamic_timeout, bool) or not isinstance(self.dynamic_timeout, (int, float)) \
                or not math.isfinite(self.dynamic_timeout) or self.dynamic_timeout < 0:
            raise ValueError(f"dynamic_timeout={self.dynamic_timeout!r}; must be a finite number of "
                             "seconds >= 0")


# =============================================================================================
# Workload
# =============================================================================================

def bench_workload(config: BenchConfig, tokenizer) -> list[Request]:
    """The fixed, seeded workload: greedy, no stop tokens, sorted by arrival."""
    if config.mode == "offline":
        arrival = dict(arrival="at_once")
    else:
        arrival = dict(arrival="poisson", rate=config.rate)
    sizes = dict(prompt_len=TINY["prompt_len"], output_len=TINY["output_len"]) if config.tiny else {}
    return make_workload(config.num_requests, config.preset, scale="cpu", seed=config.seed,
                         tokenizer=tokenizer, **arrival, **sizes)


def warmup_workload(tokenizer) -> list[Request]:
    """Two tiny requests (8-token prompts, 2 new tokens) that wake up every code path before timing."""
    return make_workload(2, prompt_len=8, output_len=2, arrival="at_once", seed=12345,
                         tokenizer=tokenizer, id_prefix="warmup")


# =============================================================================================
# Peak memory
# =============================================================================================

def _read_status_kib(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _release_free_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc), so RSS is what is alive."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """Peak RSS while a block runs, as bytes above the RSS when it began (see the module docstring).

    ``method`` says how it was measured: ``"VmHWM"`` (exact, Linux), ``"psutil-sampled-2ms"``, or
    ``"unavailable"`` (``peak_bytes`` is then None).
    """

    def __init__(self) -> None:
        self.method = "unavailable"
        self.peak_bytes: int | None = None
        self._start_rss = 0
        self._sampler: threading.Thread | None = None
        self._stop = threading.Event()
        self._sampled_peak = 0

    def __enter__(self) -> "PeakMemory":
        _release_free_memory()
        rss = _read_status_kib("VmRSS")
        if rss is not None and self._reset_high_water_mark():
            self.method, self._start_rss = "VmHWM", rss * 1024
            return self
        try:
            import psutil
        except ImportError:
            return self
        process = psutil.Process()
        self.method = "psutil-sampled-2ms"
        self._start_rss = self._sampled_peak = process.memory_info().rss

        def sample() -> None:
            while not self._stop.wait(0.002):
                self._sampled_peak = max(self._sampled_peak, process.memory_info().rss)

        self._sampler = threading.Thread(target=sample, daemon=True)
        self._sampler.start()
        return self

    @staticmethod
    def _reset_high_water_mark() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")   # "5" resets the peak RSS (VmHWM) to the current RSS (Linux >= 4.0)
            return True
        except OSError:
            return False

    def __exit__(self, *exc) -> None:
        if self.method == "VmHWM":
            self.peak_bytes = max(0, (_read_status_kib("VmHWM") or 0) * 1024 - self._start_rss)
        elif self._sampler is not None:
            self._stop.set()
            self._sampler.join()
            self.peak_bytes = max(0, self._sampled_peak - self._start_rss)


# =============================================================================================
# Contender results
# =============================================================================================

@dataclass
class ContenderRun:
    """One contender's timed run.

    ``trace``: per-request times (seconds since the timed run began; the workload's arrival
    times on the same axis) and output tokens, as a batchlab ``Trace`` so ``batchlab.metrics``
    measures every contender the same way. ``wall_seconds``: measured around the timed call;
    ``cpu_seconds``: CPU time the whole process (all threads) used meanwhile, which on a shared
    machine says how much work was done whatever share of the cores the process got.
    ``settings``: what was configured. ``extra``: contender-specific facts (steps, tries...).
    """

    name: str
    trace: Trace
    wall_seconds: float
    cpu_seconds: float
    settings: dict
    streamed: bool
    extra: dict = field(default_factory=dict)
    peak_memory_bytes: int | None = None
    memory_method: str = "unavailable"


def _record(req: Request, output_ids: list[int], token_times: list[float], release_time: float,
            streamed: bool, first_scheduled_time: float | None) -> RequestRecord:
    """A finished request as a trace record; the tokens beyond ``max_new_tokens`` are dropped."""
    n = req.max_new_tokens
    if len(output_ids) < n or len(token_times) < n:
        raise RuntimeError(f"request {req.request_id!r} got {len(output_ids)} tokens and "
                           f"{len(token_times)} token times; it needs exactly {n}")
    return RequestRecord(req.request_id, req.arrival_time, req.prompt_len, n, RequestStatus.FINISHED,
                         "length", first_scheduled_time, list(token_times[:n]), release_time,
                         streamed, [int(t) for t in output_ids[:n]])


# =============================================================================================
# transformers generate: one at a time, or static batches with left padding
# =============================================================================================

class _StepTimes:
    """A ``generate`` streamer that only notes when each step's tokens were produced.

    ``generate`` calls ``put`` once with the prompt, then once per step with that step's new
    tokens (one per sequence of the batch); ``times[i]`` is when step ``i`` ended.
    """

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter() - self.t0)

    def end(self) -> None:
        pass


def _left_padded(batch: Sequence[Request], pad_id: int):
    """(B, L) input ids padded on the left with ``pad_id``, and the matching attention mask."""
    import torch

    width = max(r.prompt_len for r in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, r in enumerate(batch):
        ids[row, width - r.prompt_len:] = torch.tensor(r.prompt_ids)
        mask[row, width - r.prompt_len:] = 1
    return ids, mask


def _generate_batch(lm, batch: Sequence[Request], t0: float) -> tuple[list[list[int]], list[float]]:
    """Run one ``generate`` call for ``batch``; returns each request's new tokens and the step end times."""
    import torch

    from transformers.generation.streamers import BaseStreamer

    class Streamer(_StepTimes, BaseStreamer):
        pass

    model, tok = lm.model, lm.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids, mask = _left_padded(batch, pad_id)
    streamer = Streamer(t0)
    with torch.inference_mode():
        # eos_token_id=None as a keyword turns EOS off; inside a GenerationConfig it would be
        # refilled from the model's defaults. The explicit mask keeps pad-id tokens in prompts.
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max(r.max_new_tokens for r in batch),
                             do_sample=False, eos_token_id=None, pad_token_id=pad_id, streamer=streamer)
    new = out[:, ids.shape[1]:].tolist()
    return new, streamer.times


def run_hf_generate(lm, requests: Sequence[Request], batch_size: int, streamed: bool,
                    name: str, warmup: list[Request] | None = None, profile: bool = False) -> ContenderRun:
    """Serve ``requests`` with ``generate`` in batches of ``batch_size`` (1 = one at a time), FIFO.

    A batch starts when the previous one has ended and all its members have arrived (a static
    batcher waits for a full batch; the last one is whatever is left). Arrivals are honoured on
    the wall clock, so offline (all at 0) nobody waits.
    """
    if warmup:
        _generate_batch(lm, warmup, time.perf_counter())
    records: dict[str, RequestRecord] = {}
    op_profile = OpProfile() if profile else contextlib.nullcontext()
    with op_profile:   # entered first: starting and stopping the profiler is not timed
        t0, c0 = time.perf_counter(), time.process_time()
        num_steps = _serve_generate(lm, requests, batch_size, streamed, t0, records)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    trace = Trace([records[r.request_id] for r in requests], meta={"clock": "wall", "policy": name})
    settings = {"batch_size": batch_size, "padding": "left", "do_sample": False, "eos_token_id": None}
    extra = {"num_generate_steps": num_steps}
    if profile:
        extra.update(_profile_extra(op_profile, wall))
    return ContenderRun(name, trace, wall, cpu, settings, streamed, extra)


def _serve_generate(lm, requests: Sequence[Request], batch_size: int, streamed: bool, t0: float,
                    records: dict[str, RequestRecord]) -> int:
    """The FIFO batch loop of ``run_hf_generate``; fills ``records``, returns the number of steps."""
    num_steps = 0
    for i in range(0, len(requests), batch_size):
        batch = requests[i:i + batch_size]
        delay = batch[-1].arrival_time - (time.perf_counter() - t0)
        if delay > 0:
            time.sleep(delay)
        start = time.perf_counter() - t0
        new_tokens, step_times = _generate_batch(lm, batch, t0)
        end = time.perf_counter() - t0
        num_steps += len(step_times)
        for req, tokens in zip(batch, new_tokens):
            times = step_times[:req.max_new_tokens]
            release = times[-1] if streamed else end
            records[req.request_id] = _record(req, tokens, times, release, streamed, start)
    return num_steps


# =============================================================================================
# transformers continuous batching: ContinuousBatchingManager
# =============================================================================================

def hf_num_blocks(requests: Sequence[Request], page_size: int, safety_margin: float = 0.15) -> int:
    """KV pages for every request at once (prompt + all new tokens each), above the FIFO
    scheduler's safety margin (it admits no new prompt when fewer than 15% of pages are free)."""
    needed = sum(math.ceil(r.max_total_tokens / page_size) for r in requests)
    return math.ceil(needed / (1 - safety_margin)) + 2


def _quiet_transformers_logs():
    """Silence transformers' info/warning lines while the manager runs (restored by the caller)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    return lambda: hf_logging.set_verbosity(level)


class _HFManager:
    """A started ``ContinuousBatchingManager`` for the model, with greedy, EOS-free settings."""

    def __init__(self, lm, max_batch_tokens: int, page_size: int, num_blocks: int, max_new_tokens: int,
                 profile: bool = False) -> None:
        from transformers import ContinuousBatchingConfig, GenerationConfig

        pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
        generation = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=-1,
                                      pad_token_id=pad_id)
        self.cb_config = ContinuousBatchingConfig(page_size=page_size, num_blocks=num_blocks,
                                                  max_batch_tokens=max_batch_tokens)
        self.manager = lm.model.init_continuous_batching(generation_config=generation,
                                                         continuous_batching_config=self.cb_config)
        # When each model step (forward, logits, sampling) ran: the rest of the loop's time is
        # the engine's own work (scheduling, building the batch tensors, updating requests).
        # ``_generation_step`` is looked up on the instance by the loop, so this wraps only it.
        self.step_times: list[tuple[float, float]] = []
        step = self.manager._generation_step

        def timed_step() -> None:
            start = time.perf_counter()
            step()
            self.step_times.append((start, time.perf_counter()))

        self.manager._generation_step = timed_step
        self.op_profile = OpProfile() if profile else None
        if profile:
            # The profiler is thread-local: run the manager's loop inside it, in its own thread.
            # (``start`` looks the method up on the instance, so this wraps only this manager.)
            loop = self.manager._run_generation_loop

            def profiled_loop(**kwargs) -> None:
                with self.op_profile:
                    loop(**kwargs)

            self.manager._run_generation_loop = profiled_loop
        self.manager.start()

    def serve(self, requests: Sequence[Request], timeout: float) -> tuple[dict, dict, float, float, float]:
        """Feed ``requests`` at their arrival times from a thread; collect every result.

        Returns (results by id, submit times by id, t0, end, CPU seconds), times from
        ``time.perf_counter``.
        """
        manager = self.manager
        submitted: dict[str, float] = {}
        feed_error: list[BaseException] = []
        t0, c0 = time.perf_counter(), time.process_time()

        def feed() -> None:
            try:
                for req in requests:
                    delay = req.arrival_time - (time.perf_counter() - t0)
                    if delay > 0:
                        time.sleep(delay)
                    submitted[req.request_id] = time.perf_counter()
                    manager.add_request(req.prompt_ids, request_id=req.request_id,
                                        max_new_tokens=req.max_new_tokens, streaming=False,
                                        record_timestamps=True, eos_token_id=-1)
            except BaseException as err:   # reported by the collector below
                feed_error.append(err)

        feeder = threading.Thread(target=feed, name="bench-feeder", daemon=True)
        feeder.start()
        results: dict = {}
        deadline = time.perf_counter() + timeout
        while len(results) < len(requests):
            out = manager.get_result(timeout=0.5)
            if out is not None:
                if out.is_finished() or out.error is not None:
                    results[out.request_id] = out
                continue
            if feed_error:
                raise RuntimeError(f"feeding the manager failed: {feed_error[0]!r}") from feed_error[0]
            if not manager.is_running():
                raise RuntimeError("transformers' generation thread stopped with "
                                   f"{len(requests) - len(results)} requests unfinished")
            if time.perf_counter() > deadline:
                raise TimeoutError(f"transformers' continuous batching did not finish in {timeout:.0f} s "
                                   f"({len(results)} of {len(requests)} done)")
        end, cpu = time.perf_counter(), time.process_time() - c0
        feeder.join()
        return results, submitted, t0, end, cpu

    def steps_between(self, start: float, end: float) -> tuple[int, float]:
        """How many model steps began in ``[start, end]`` and the seconds they took."""
        inside = [(s, e) for s, e in self.step_times if start <= s <= end]
        return len(inside), sum(e - s for s, e in inside)

    def close(self) -> None:
        self.manager.stop(block=True, timeout=30)
        self.manager.destroy()


def run_hf_continuous_once(lm, requests: Sequence[Request], max_batch_tokens: int, page_size: int,
                           warmup: list[Request] | None, timeout: float,
                           profile: bool = False) -> ContenderRun:
    """One try of transformers' continuous batching at ``max_batch_tokens``.

    With ``profile``, the op profile covers the manager's whole loop (warm-up included)."""
    num_blocks = hf_num_blocks(list(requests) + list(warmup or []), page_size)
    max_new = max(r.max_new_tokens for r in requests)
    restore_logs = _quiet_transformers_logs()
    server = None
    try:
        server = _HFManager(lm, max_batch_tokens, page_size, num_blocks, max_new, profile)
        if warmup:
            server.serve(warmup, timeout)
        results, submitted, t0, end, cpu = server.serve(requests, timeout)
        num_steps, busy = server.steps_between(t0, end)
    finally:
        if server is not None:
            server.close()
        restore_logs()
    records, failures = [], {}
    for req in requests:
        out = results[req.request_id]
        if out.error is not None:
            failures[req.request_id] = str(out.error)
            continue
        times = [t - t0 for t in out.timestamps]
        records.append(_record(req, out.generated_tokens, times, times[req.max_new_tokens - 1], True,
                               out.lifespan[0] - t0 if out.lifespan[0] > 0 else None))
    if failures:
        raise RuntimeError(f"transformers' continuous batching failed {len(failures)} requests: "
                           f"{dict(list(failures.items())[:3])}")
    lateness = [submitted[r.request_id] - t0 - r.arrival_time for r in requests]
    trace = Trace(records, meta={"clock": "wall", "policy": "hf_continuous"})
    settings = {"max_batch_tokens": max_batch_tokens, "page_size": page_size, "num_blocks": num_blocks,
                "attn_implementation": lm.model.config._attn_implementation, "do_sample": False,
                "eos_token_id": -1, "scheduler": "fifo"}
    extra = {"num_steps": num_steps, "busy_seconds": busy, "max_submit_lateness_s": max(lateness)}
    if profile:   # the loop's profile also holds the two warm-up requests: shares, not seconds, matter
        extra["op_seconds"] = dict(server.op_profile.seconds)
    return ContenderRun("hf_continuous", trace, end - t0, cpu, settings, True, extra)


# =============================================================================================
# batchlab
# =============================================================================================

def _batchlab_scheduler(name: str, config: BenchConfig):
    from .schedulers import ContinuousBatcher, DynamicBatcher, StaticBatcher

    if name == "batchlab_static":
        return StaticBatcher(config.batch_size)
    if name == "batchlab_dynamic":
        return DynamicBatcher(config.batch_size, config.dynamic_timeout)
    return ContinuousBatcher(config.max_num_seqs, config.max_batched_tokens)


def run_batchlab(lm, requests: Sequence[Request], name: str, config: BenchConfig,
                 warmup: list[Request] | None) -> ContenderRun:
    """Serve ``requests`` with one of batchlab's engines on the real model.

    Offline the engine runs on its virtual clock (its TTFT/E2E are sums of measured step
    times); online on the wall clock. ``wall_seconds`` is always measured around ``run``.
    """
    from .backends import ModelBackend
    from .engine import Engine

    num_slots = config.max_num_seqs if name == "batchlab_continuous" else config.batch_size
    max_seq_len = max(r.max_total_tokens for r in list(requests) + list(warmup or []))
    backend = ModelBackend(lm, max_num_seqs=num_slots, max_seq_len=max_seq_len)
    clock = "virtual" if config.mode == "offline" else "wall"
    if warmup:
        Engine(_batchlab_scheduler(name, config), backend, clock="virtual").run(list(warmup))
    scheduler = _batchlab_scheduler(name, config)
    engine = Engine(scheduler, backend, clock=clock)
    op_profile = OpProfile() if config.profile else contextlib.nullcontext()
    with op_profile:   # entered first: starting and stopping the profiler is not timed
        t0, c0 = time.perf_counter(), time.process_time()
        trace = engine.run(list(requests))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    steps = trace.steps_df()
    prefill_steps = steps["num_prefill_tokens"] > 0
    settings = {"scheduler": repr(scheduler), "clock": clock, "kv_slots": num_slots,
                "max_seq_len": max_seq_len, "backend": backend.describe()}
    extra = {"num_steps": len(steps), "busy_seconds": float(steps["duration"].sum()),
             "prefill_step_seconds": float(steps.loc[prefill_steps, "duration"].sum()),
             "decode_only_step_seconds": float(steps.loc[~prefill_steps, "duration"].sum()),
             "mean_seqs_per_step": float(steps["num_seqs"].mean()) if len(steps) else float("nan"),
             "trace_duration_s": float(trace.duration)}
    if config.profile:
        extra.update(_profile_extra(op_profile, wall))
    del backend
    return ContenderRun(name, trace, wall, cpu, settings, scheduler.streams_tokens, extra)


# =============================================================================================
# Where the time goes: op profile (--profile) and this machine's limits
# =============================================================================================

# Categories of torch ops, matched against op names in this order; the rest is "other ops".
OP_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear", "aten::matmul")),
    ("attention", ("scaled_dot_product", "softmax")),
    ("copies & indexing", ("copy_", "index", "aten::cat", "aten::stack", "fill_", "zero_", "clone",
                           "gather", "scatter", "masked_fill", "aten::where", "aten::empty")),
)


def op_category(name: str) -> str:
    """The category of a torch op name (``OP_CATEGORIES``), else ``"other ops"``."""
    for category, patterns in OP_CATEGORIES:
        if any(p == name if p.startswith("aten::") and category == "matmul" else p in name for p in patterns):
            return category
    return "other ops"


class OpProfile:
    """``torch.profiler`` over the ops run by the thread that enters it; self time per category.

    The profiler is thread-local, so for transformers' manager it is entered inside the
    generation thread (``_HFManager``). ``seconds`` maps each category to seconds of op self time.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._prof = None

    def __enter__(self) -> "OpProfile":
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU])
        self._prof.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._prof.__exit__(*exc)
        totals = dict.fromkeys([c for c, _ in OP_CATEGORIES] + ["other ops"], 0.0)
        for event in self._prof.key_averages():
            totals[op_category(event.key)] += event.self_cpu_time_total / 1e6   # microseconds
        self.seconds = totals
        self._prof = None


def _profile_extra(profile: OpProfile, wall_seconds: float) -> dict:
    """Op seconds per category, and the wall time spent outside torch ops (Python, waiting)."""
    ops = dict(profile.seconds)
    return {"op_seconds": ops, "outside_ops_seconds": max(0.0, wall_seconds - sum(ops.values()))}


def machine_limits(lm, requests: Sequence[Request]) -> dict:
    """Lower bounds on the time any engine needs for ``requests`` with these fp32 weights, here, now.

    - Memory: every step reads all the weights, and the longest request needs one step per
      output token, so ``time >= max_new_tokens * weight bytes / bandwidth``.
    - Compute: every token passes through every weight matrix (2 FLOPs per weight), and every
      output token also through the LM head, so ``time >= FLOPs / matmul speed``.
    Bandwidth and matmul speed are measured now, with the current torch threads (best of 5).
    Attention and everything else are left out, so the true minimum is higher still.
    """
    import torch
    import torch.nn.functional as F

    from .profiler import measure_bandwidth

    params = {id(p): p for p in lm.model.parameters()}          # tied weights once
    weight_bytes = sum(p.numel() * p.element_size() for p in params.values())
    head = lm.model.get_output_embeddings().weight                 # (vocab, hidden), tied to the input
    body_params = sum(p.numel() for p in params.values()) - head.numel()
    bandwidth = measure_bandwidth(device=lm.model.device)   # reads a 256 MiB tensor
    hidden = head.shape[1]
    device = lm.model.device
    a = torch.randn(512, hidden, device=device)                    # a prefill-sized, MLP-like matmul
    w = torch.randn(3 * hidden, hidden, device=device)
    best = float("inf")
    with torch.inference_mode():
        F.linear(a, w)
        for _ in range(5):
            t0 = time.perf_counter()
            F.linear(a, w)
            best = min(best, time.perf_counter() - t0)
    matmul_flops = 2 * a.shape[0] * w.shape[0] * hidden / best
    prompt = sum(r.prompt_len for r in requests)
    output = sum(r.max_new_tokens for r in requests)
    steps = max(r.max_new_tokens for r in requests)
    flops = 2 * body_params * (prompt + output) + 2 * head.numel() * output
    memory_bound, compute_bound = steps * weight_bytes / bandwidth, flops / matmul_flops
    bound = max(memory_bound, compute_bound)
    return {"weight_bytes": weight_bytes, "bandwidth_bytes_s": bandwidth,
            "step_floor_s": weight_bytes / bandwidth, "min_steps": steps,
            "memory_bound_s": memory_bound, "flops": flops,
            "matmul_flops_s": matmul_flops, "compute_bound_s": compute_bound, "bound_s": bound,
            "bound_tok_s": output / bound}


# =============================================================================================
# Running everything
# =============================================================================================

def contender_summary(run: ContenderRun) -> dict:
    """The numbers the table shows, from the run's trace and wall time (seconds, tokens/s)."""
    per_request = metrics.per_request_metrics(run.trace)
    output_tokens = int(per_request["num_output_tokens"].sum())
    ttft, e2e = per_request["ttft"].to_numpy(), per_request["e2e"].to_numpy()
    unfinished = {r.request_id: r.finish_reason or RequestStatus(r.status).value
                  for r in run.trace.requests if RequestStatus(r.status) != RequestStatus.FINISHED}
    return {
        "label": LABELS[run.name], "streamed": run.streamed,
        "num_requests": len(run.trace.requests), "num_finished": int(len(per_request)),
        "unfinished": unfinished, "output_tokens": output_tokens,
        "wall_seconds": run.wall_seconds, "cpu_seconds": run.cpu_seconds,
        "throughput_tok_s": output_tokens / run.wall_seconds,
        "tokens_per_cpu_second": output_tokens / run.cpu_seconds if run.cpu_seconds > 0 else None,
        "ttft_p50_s": float(np.percentile(ttft, 50)), "ttft_p99_s": float(np.percentile(ttft, 99)),
        "e2e_p50_s": float(np.percentile(e2e, 50)), "e2e_p99_s": float(np.percentile(e2e, 99)),
        "peak_memory_mib": None if run.peak_memory_bytes is None else run.peak_memory_bytes / 2**20,
        "memory_method": run.memory_method,
    }


def greedy_agreement(outputs: dict[str, dict[str, list[int]]], reference: str) -> dict:
    """For each run: how many requests' tokens equal ``reference``'s exactly, and for the others
    the first position where they differ (or the shorter length, if one is a prefix)."""
    ref = outputs[reference]
    report = {}
    for name, tokens_by_id in outputs.items():
        mismatches = {}
        for rid, ref_tokens in ref.items():
            mine = tokens_by_id.get(rid)
            if mine is None:
                mismatches[rid] = None
                continue
            if mine != ref_tokens:
                first = next((i for i, (a, b) in enumerate(zip(mine, ref_tokens)) if a != b),
                             min(len(mine), len(ref_tokens)))
                mismatches[rid] = first
        report[name] = {"matches": len(ref) - len(mismatches), "total": len(ref),
                        "mismatches_first_position": mismatches}
    return report


def machine_info() -> dict:
    """Where the numbers come from: CPU, cores, threads, versions, load."""
    import torch
    import transformers

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "cores_available": cores, "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__,
            "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def _page_in_weights(lm, request: Request) -> None:
    """One forward pass before any contender: the weights are memory-mapped from the cached
    checkpoint, and the first pass reads them in (about 500 MiB of RSS). Without it the first
    contender would be charged for the shared weights."""
    import torch

    with torch.inference_mode():
        lm.model(torch.tensor([request.prompt_ids]))


def _measured(fn: Callable[[], ContenderRun]) -> ContenderRun:
    with PeakMemory() as mem:
        run = fn()
    run.peak_memory_bytes, run.memory_method = mem.peak_bytes, mem.method
    return run


def run_benchmark(config: BenchConfig, lm=None, log: Callable[[str], None] = print) -> dict:
    """Run every chosen contender on the workload; returns the JSON-ready results."""
    import torch

    from .model import load_model, set_cpu_threads

    lm = lm if lm is not None else load_model()
    threads_before = torch.get_num_threads()
    if config.threads is not None:
        set_cpu_threads(config.threads)
    try:
        return _run_all(_effective(config), lm, log)
    finally:
        torch.set_num_threads(threads_before)   # leave an in-process caller's setting as it was


def _run_all(config: BenchConfig, lm, log: Callable[[str], None]) -> dict:
    requests = bench_workload(config, lm.tokenizer)
    warm = warmup_workload(lm.tokenizer) if config.warmup else None
    _page_in_weights(lm, warmup_workload(lm.tokenizer)[0])
    log("measuring this machine's memory bandwidth and matmul speed ...")
    limits = machine_limits(lm, requests)
    hf_timeout = 60.0 + 5.0 * sum(r.max_new_tokens for r in requests)   # generous: a hang, not slowness
    results: dict = {"machine": machine_info(), "config": _config_dict(config),
                     "workload": _workload_dict(config, requests),
                     "model": {"name": lm.name, "device": lm.device, "dtype": lm.dtype},
                     "limits": limits, "contenders": {}, "errors": {}}
    outputs: dict[str, dict[str, list[int]]] = {}

    def keep(run: ContenderRun) -> None:
        summary = contender_summary(run)
        results["contenders"][run.name] = {**summary, "settings": run.settings, "extra": run.extra,
                                           "requests": _requests_dict(run.trace)}
        outputs[run.name] = {r.request_id: r.output_ids for r in run.trace.requests}
        log(f"  {run.name:<20} {summary['throughput_tok_s']:8.1f} tok/s  wall {run.wall_seconds:7.2f} s  "
            f"TTFT p50 {summary['ttft_p50_s']:6.2f} s")

    for name in CONTENDERS:
        if name not in config.only:
            continue
        log(f"running {name} ...")
        try:
            if name == "hf_continuous":
                tries = []
                for mbt in config.hf_batch_tokens:
                    run = _measured(lambda: run_hf_continuous_once(
                        lm, requests, mbt, config.hf_page_size, warm, hf_timeout, config.profile))
                    tries.append(run)
                    summary = contender_summary(run)
                    log(f"    max_batch_tokens={mbt:<5} {summary['throughput_tok_s']:8.1f} tok/s  "
                        f"TTFT p50 {summary['ttft_p50_s']:6.2f} s  ({run.extra['num_steps']} steps)")
                best = max(tries, key=lambda r: contender_summary(r)["throughput_tok_s"])
                best.extra["tries"] = [{**r.settings, **r.extra, **contender_summary(r)} for r in tries]
                keep(best)
            elif name in HF_CONTENDERS:
                size, streamed = (1, True) if name == "hf_sequential" else (config.batch_size, False)
                keep(_measured(lambda: run_hf_generate(lm, requests, size, streamed, name, warm,
                                                       config.profile)))
            else:
                keep(_measured(lambda: run_batchlab(lm, requests, name, config, warm)))
        except Exception as err:   # one contender failing must not hide the others' numbers
            results["errors"][name] = f"{type(err).__name__}: {err}"
            log(f"  {name} FAILED: {results['errors'][name]}")

    _add_ratios(results)
    if config.mode == "offline":
        _bound_fractions(results)
    reference = GREEDY_REFERENCE if GREEDY_REFERENCE in outputs else next(iter(outputs), None)
    results["greedy_reference"] = reference
    results["greedy_agreement"] = greedy_agreement(outputs, reference) if reference else {}
    results["goal"] = _goal(results) if config.mode == "offline" else None
    results["machine"]["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return results


def _effective(config: BenchConfig) -> BenchConfig:
    """``tiny`` replaces the sizes with ``TINY``'s."""
    if not config.tiny:
        return config
    return BenchConfig(**{**asdict(config), "num_requests": TINY["num_requests"],
                          "hf_batch_tokens": TINY["hf_batch_tokens"], "rate": max(config.rate, 20.0)})


def _add_ratios(results: dict) -> None:
    ref = results["contenders"].get(REFERENCE)
    for summary in results["contenders"].values():
        if ref is None:
            summary["throughput_vs_hf_continuous"] = summary["ttft_p50_vs_hf_continuous"] = None
            summary["cpu_efficiency_vs_hf_continuous"] = None
            continue
        summary["throughput_vs_hf_continuous"] = summary["throughput_tok_s"] / ref["throughput_tok_s"]
        mine, theirs = summary["tokens_per_cpu_second"], ref["tokens_per_cpu_second"]
        summary["cpu_efficiency_vs_hf_continuous"] = mine / theirs if mine and theirs else None
        summary["ttft_p50_vs_hf_continuous"] = summary["ttft_p50_s"] / ref["ttft_p50_s"]


def _bound_fractions(results: dict) -> None:
    """Each contender's throughput as a fraction of the machine's bound (offline only)."""
    bound = results["limits"]["bound_tok_s"]
    for summary in results["contenders"].values():
        summary["fraction_of_bound"] = summary["throughput_tok_s"] / bound


def _goal(results: dict) -> dict | None:
    ours, ref = results["contenders"].get("batchlab_continuous"), results["contenders"].get(REFERENCE)
    if ours is None or ref is None:
        return None
    speedup, ttft = ours["throughput_vs_hf_continuous"], ours["ttft_p50_vs_hf_continuous"]
    return {"throughput_ratio": speedup, "cpu_efficiency_ratio": ours["cpu_efficiency_vs_hf_continuous"],
            "throughput_target": GOAL_THROUGHPUT_RATIO,
            "throughput_met": speedup >= GOAL_THROUGHPUT_RATIO,
            "ttft_p50_ratio": ttft, "ttft_p50_target": GOAL_TTFT_RATIO, "ttft_met": ttft <= GOAL_TTFT_RATIO}


def _config_dict(config: BenchConfig) -> dict:
    d = asdict(config)
    d["only"], d["hf_batch_tokens"] = list(config.only), list(config.hf_batch_tokens)
    return d


def _workload_dict(config: BenchConfig, requests: Sequence[Request]) -> dict:
    return {"preset": config.preset, "scale": "cpu", "seed": config.seed, "mode": config.mode,
            "arrival": "at_once" if config.mode == "offline" else "poisson",
            "rate": None if config.mode == "offline" else config.rate,
            "num_requests": len(requests),
            "prompt_tokens": sum(r.prompt_len for r in requests),
            "output_tokens": sum(r.max_new_tokens for r in requests),
            "requests": [{"request_id": r.request_id, "arrival_time": r.arrival_time,
                          "prompt_len": r.prompt_len, "max_new_tokens": r.max_new_tokens} for r in requests]}


def _requests_dict(trace: Trace) -> list[dict]:
    return [{"request_id": r.request_id, "token_times": r.token_times, "release_time": r.release_time,
             "output_ids": r.output_ids} for r in trace.requests]


# =============================================================================================
# Printing
# =============================================================================================

def format_header(results: dict, command: str) -> str:
    m, w = results["machine"], results["workload"]
    load = m.get("loadavg_start")
    lines = [f"batchlab.bench  {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}",
             f"command:  {command}",
             f"machine:  {m['cpu']}, {m['cores_available']} cores available, torch threads "
             f"{m['torch_threads']}, {m['platform']}",
             f"versions: python {m['python']}, torch {m['torch']}, transformers {m['transformers']}",
             f"model:    {results['model']['name']} on {results['model']['device']} "
             f"({results['model']['dtype']})",
             f"load:     os.getloadavg() = {tuple(round(x, 2) for x in load) if load else 'n/a'} "
             "(1, 5, 15 min) at start",
             f"workload: {w['num_requests']} requests, preset {w['preset']!r} (scale cpu), seed {w['seed']}, "
             f"{w['prompt_tokens']} prompt + {w['output_tokens']} output tokens, greedy, exact lengths, "
             + ("all at t=0 (offline)" if w["mode"] == "offline"
                else f"Poisson at {w['rate']} req/s (online)")]
    return "\n".join(lines)


def format_table(results: dict) -> str:
    """The contenders side by side; ratios are to transformers' continuous batching."""
    head = (f"{'contender':<44} {'stream':>6} {'tok/s':>7} {'x HF-CB':>7} {'tok/CPU-s':>9} {'x HF-CB':>7} "
            f"{'TTFT p50':>9} {'TTFT p99':>9} "
            f"{'E2E p50':>8} {'E2E p99':>8} {'TTFT50 /HF':>10} {'peak MiB':>9} {'greedy =':>9}")
    lines = [head, "-" * len(head)]
    agreement = results.get("greedy_agreement", {})
    for name in CONTENDERS:
        s = results["contenders"].get(name)
        if s is None:
            if name in results.get("errors", {}):
                lines.append(f"{LABELS[name]:<44} FAILED: {results['errors'][name]}")
            continue
        label = s["label"]
        if name == "hf_continuous":
            label += f" (mbt={s['settings']['max_batch_tokens']})"
        elif name in ("hf_static", "batchlab_static", "batchlab_dynamic"):
            label += f" of {results['config']['batch_size']}"
        ratio = "" if s["throughput_vs_hf_continuous"] is None else f"{s['throughput_vs_hf_continuous']:.2f}x"
        cpu_ratio = "" if s["cpu_efficiency_vs_hf_continuous"] is None \
            else f"{s['cpu_efficiency_vs_hf_continuous']:.2f}x"
        per_cpu = "n/a" if s["tokens_per_cpu_second"] is None else f"{s['tokens_per_cpu_second']:.1f}"
        ttft_ratio = "" if s["ttft_p50_vs_hf_continuous"] is None else f"{s['ttft_p50_vs_hf_continuous']:.2f}"
        mem = "n/a" if s["peak_memory_mib"] is None else f"{s['peak_memory_mib']:.0f}"
        agree = agreement.get(name)
        greedy = "" if agree is None else f"{agree['matches']}/{agree['total']}"
        lines.append(f"{label:<44} {'yes' if s['streamed'] else 'no':>6} {s['throughput_tok_s']:7.1f} "
                     f"{ratio:>7} {per_cpu:>9} {cpu_ratio:>7} {s['ttft_p50_s']:8.2f}s "
                     f"{s['ttft_p99_s']:8.2f}s {s['e2e_p50_s']:7.2f}s {s['e2e_p99_s']:7.2f}s "
                     f"{ttft_ratio:>10} {mem:>9} {greedy:>9}")
    return "\n".join(lines)


def format_details(results: dict) -> str:
    """Greedy mismatches, the manager's tries, where the time went, and the goal."""
    lines = []
    for name, s in results["contenders"].items():
        if s["unfinished"]:
            lines.append(f"{name}: {len(s['unfinished'])} of {s['num_requests']} requests did not finish: "
                         + "; ".join(f"{rid}: {why}" for rid, why in s["unfinished"].items()))
    ref = results.get("greedy_reference")
    for name, agree in results.get("greedy_agreement", {}).items():
        if agree["mismatches_first_position"]:
            firsts = ", ".join(f"{rid}@{pos}" for rid, pos in agree["mismatches_first_position"].items())
            lines.append(f"greedy: {name} differs from {ref} in {len(agree['mismatches_first_position'])} "
                         f"requests (request@first differing token): {firsts}")
    if ref and not any(a["mismatches_first_position"] for a in results["greedy_agreement"].values()):
        lines.append(f"greedy: every contender's tokens equal {ref}'s for every request")
    cb = results["contenders"].get("hf_continuous")
    if cb:
        tries = ", ".join(f"mbt={t['max_batch_tokens']}: {t['throughput_tok_s']:.1f} tok/s"
                          for t in cb["extra"].get("tries", []))
        e = cb["extra"]
        lines.append(f"transformers CB tries: {tries}; {cb['settings']['num_blocks']} KV pages of "
                     f"{cb['settings']['page_size']} tokens")
        ms_per_step = 1e3 * e["busy_seconds"] / max(e["num_steps"], 1)
        lines.append(f"hf_continuous: {e['num_steps']} steps, {ms_per_step:.1f} "
                     f"ms/step; model steps {e['busy_seconds']:.2f} s of {cb['wall_seconds']:.2f} s wall")
    for name in BATCHLAB_CONTENDERS:
        s = results["contenders"].get(name)
        if s:
            e = s["extra"]
            ms_per_step = 1e3 * e["busy_seconds"] / max(e["num_steps"], 1)
            lines.append(f"{name}: {e['num_steps']} steps, {ms_per_step:.1f} ms/step; model "
                         f"{e['busy_seconds']:.2f} s (prefill steps {e['prefill_step_seconds']:.2f} s, "
                         f"decode-only {e['decode_only_step_seconds']:.2f} s) of "
                         f"{s['wall_seconds']:.2f} s wall; "
                         f"{e['mean_seqs_per_step']:.1f} seqs/step")
    for name in CONTENDERS:
        s = results["contenders"].get(name)
        if s and "op_seconds" in s["extra"]:
            ops = s["extra"]["op_seconds"]
            total = sum(ops.values())
            shares = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in ops.items())
            outside = s["extra"].get("outside_ops_seconds")
            outside = ("" if outside is None
                       else f"; outside torch ops {outside:.1f} s of {s['wall_seconds']:.1f} s wall")
            lines.append(f"profile {name}: torch op time {total:.1f} s = {shares}{outside}")
    limits = results.get("limits")
    if limits and results["workload"]["mode"] == "offline":
        ref = results["contenders"].get(REFERENCE)
        room = "" if ref is None else (
            f"; transformers CB reaches {100 * ref['fraction_of_bound']:.0f}% of it, "
            f"so no engine could be more than {1 / ref['fraction_of_bound']:.1f}x faster")
        lines.append(f"limits here and now (torch threads {results['machine']['torch_threads']}): weights "
                     f"{limits['weight_bytes'] / 1e6:.0f} MB at "
                     f"{limits['bandwidth_bytes_s'] / 1e9:.1f} GB/s = "
                     f"{1e3 * limits['step_floor_s']:.0f} ms/step x {limits['min_steps']} steps = "
                     f"{limits['memory_bound_s']:.1f} s; {limits['flops'] / 1e9:.0f} GFLOP at "
                     f"{limits['matmul_flops_s'] / 1e9:.0f} GFLOP/s = {limits['compute_bound_s']:.1f} s; "
                     f"so at most {limits['bound_tok_s']:.0f} tok/s for any fp32 engine{room}")
    goal = results.get("goal")
    if goal:
        cpu = ("" if goal["cpu_efficiency_ratio"] is None
               else f", {goal['cpu_efficiency_ratio']:.2f}x per CPU-second")
        lines.append(f"goal (offline): throughput {goal['throughput_ratio']:.2f}x transformers CB{cpu} "
                     f"(target >= {goal['throughput_target']:.0f}x: "
                     f"{'met' if goal['throughput_met'] else 'missed'}); "
                     f"TTFT p50 {goal['ttft_p50_ratio']:.2f} of its (target <= 0.33: "
                     f"{'met' if goal['ttft_met'] else 'missed'})")
    load = results["machine"].get("loadavg_end")
    if load:
        lines.append(f"load at end: os.getloadavg() = {tuple(round(x, 2) for x in load)}")
    return "\n".join(lines)


# =============================================================================================
# Command line
# =============================================================================================

def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def parse_args(argv: Sequence[str] | None = None) -> tuple[BenchConfig, str]:
    p = argparse.ArgumentParser(prog="python -m batchlab.bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=MODES, default="offline",
                   help="offline: all requests at t=0; online: Poisson arrivals on the wall clock")
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--rate", type=float, default=2.0, help="requests/s for --mode online")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default=",".join(CONTENDERS),
                   help=f"comma-separated contenders (default all): {','.join(CONTENDERS)}")
    p.add_argument("--batch-size", type=int, default=8, help="static/dynamic batch size")
    p.add_argument("--dynamic-timeout", type=float, default=0.1, help="dynamic batcher timeout, s")
    p.add_argument("--max-num-seqs", type=int, default=32, help="batchlab continuous: sequences at once")
    p.add_argument("--max-batched-tokens", type=int, default=512, help="batchlab continuous: tokens per step")
    p.add_argument("--hf-batch-tokens", type=_int_list, default=(64, 128, 256, 512),
                   help="max_batch_tokens values tried for transformers' continuous batching")
    p.add_argument("--hf-page-size", type=int, default=64,
                   help="tokens per KV page for transformers' manager")
    p.add_argument("--tiny", action="store_true", help="4 requests of a few tokens (the test's size)")
    p.add_argument("--no-warmup", action="store_true", help="skip the two warm-up requests per contender")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: every core this process may use)")
    p.add_argument("--profile", action="store_true",
                   help="profile each timed run's torch ops and print where the time goes (adds overhead)")
    p.add_argument("--out", default="bench_results.json", help="where to write the JSON results")
    args = p.parse_args(argv)
    config = BenchConfig(mode=args.mode, num_requests=args.num_requests, rate=args.rate, seed=args.seed,
                         only=tuple(x.strip() for x in args.only.split(",") if x.strip()),
                         batch_size=args.batch_size, dynamic_timeout=args.dynamic_timeout,
                         max_num_seqs=args.max_num_seqs, max_batched_tokens=args.max_batched_tokens,
                         hf_batch_tokens=args.hf_batch_tokens, hf_page_size=args.hf_page_size,
                         tiny=args.tiny, warmup=not args.no_warmup, threads=args.threads,
                         profile=args.profile)
    return config, args.out


def main(argv: Sequence[str] | None = None, lm=None) -> dict:
    """Run the benchmark from command-line arguments; print the table; write the JSON."""
    argv = list(sys.argv[1:] if argv is None else argv)
    config, out = parse_args(argv)
    command = " ".join(["python -m batchlab.bench", *argv])
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"batchlab.bench: {command}\nos.getloadavg() = {load}", flush=True)
    results = run_benchmark(config, lm=lm, log=lambda s: print(s, flush=True))
    results["command"] = command
    results["created_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    text = "\n\n".join([format_header(results, command), format_table(results), format_details(results)])
    print("\n" + text)
    results["table"] = text
    path = Path(out)
    if path.parent != Path(""):
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, default=_json_default) + "\n")
    print(f"\nJSON written to {path}")
    return results


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    return str(value)


if __name__ == "__main__":
    main()
