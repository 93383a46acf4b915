"""The transformers contenders: ``generate`` one at a time or in static batches, and its
continuous batching (``ContinuousBatchingManager``)."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Sequence

from .contenders import ContenderRun, OpProfile, _profile_extra, _record
from batchlab.requests import Request
from batchlab.trace import RequestRecord, Trace


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


