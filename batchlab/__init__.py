"""batchlab: how LLM inference servers batch requests, measured on a real model.

The layout follows the architecture, and imports only run downward. At the top, the serving
core, which knows nothing about tensors: one step is ``plan = scheduler.schedule(now)`` ->
``backend.run(plan)`` -> apply the tokens -> ``scheduler.remove_ended()`` (``Engine.step``).

  engine       Engine.step, the one step; end_request, the one place a request ends
  loop         the serving loop every driver runs (run_until): admit arrivals, step, wait
  offline      the offline driver (Engine.run): a known workload, a progress bar, the fast path
  online       the online driver (Engine.run_online): a thread-safe inbox (add/abort/stop)
  fast_path    the simulator's bulk decode runs, asked of the policy and its KV space
  contract     what the engine checks (workloads, plans, how every request ended), and what it
               offers its drivers (ServingEngine)
  listener     what an engine tells a listener: each step's output (typed), every end
  requests     Request, SamplingParams, RequestStatus, FinishReason: what a client asked for,
               and its state
  plan         StepPlan / ScheduledChunk (one rule for prefill and decode) and a step's features
  kv_space     the KV contract every cache implements with the same calls (admit, grow, free);
               TokenKVSpace for the simulator
  kv_blocks    paged KV accounting: blocks, block tables, growth, prefix hashes, LRU eviction
  shapes       models' shapes as data (shapes.json, or a model's config.json): weights, work,
               KV bytes per token
  clock        the virtual and wall clocks
  trace        what a run records (per request, per step), as DataFrames
  checks       the argument checks every module shares

Folders (each one's ``__init__`` says why it exists):

  schedulers/  policies: StaticBatcher, DynamicBatcher, ContinuousBatcher (never touch tensors)
  backends/    what computes a step: ModelBackend (the real model), SimBackend (a cost model:
               the additive fit, the GPU roofline, or measured vLLM kernels)
  model/       the model itself: loading, the batched Llama step, KV cache storage (slots and
               paged blocks, one step layout), sampling, profiler, one-prompt generation, the
               machine report, the CPU dtype probe, answers alone vs batched
  workloads/   who asks what, and when: arrivals, lengths, prompts, workload files, scripted scenes,
               chat sessions that share prefixes
  analysis/    what only reads traces: metrics, plots, widgets, diagnosis, batches, KV usage,
               trace files, stored device profiles; claims (a notebook's checks, one verdict each)
  experiments/ the lessons' measurements: calibration of the simulator, prefill stalls, load sweeps
  loadgen/     a load client for any OpenAI-compatible server; builds a Trace
               (python -m batchlab.loadgen); reading a server's /metrics (prom), a soak load
  serve/       an OpenAI-compatible HTTP server over the online engine (python -m batchlab.serve)
  vllm_sim/    one vLLM replica on simulated GPUs (VllmReplica): vLLM's flags and defaults, its
               KV memory, its step time on measured kernels, async scheduling; every GPU lesson's step
  vllm_ref/    vLLM's server on the same model, from its own venv, as the reference
  cluster/     many replicas behind a router on one virtual clock: routing policies, dead
               replicas, predicted vs actual prefix hits, sweeps in process or on Ray; and the
               real vllm-router on loopback in front of simulated servers
  predict/     a whole vLLM deployment on GPUs predicted before it is rented, and recommended
  exercises/   the notebooks' exercise checkers (worked solutions live in solutions/)

Beside the package: ``benchmarks/`` (speed measured and printed, never asserted; the peer
benchmark against transformers and vLLM is ``python -m benchmarks.peer``) and ``scripts/``.

Each notebook teaches one piece by writing it out first, then imports it from here.
"""

__version__ = "0.1.0"
