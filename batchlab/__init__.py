"""batchlab: how LLM inference servers batch requests, measured on a real model.

The layout follows the architecture. At the top, the serving core, which knows nothing about
tensors: one step is ``plan = scheduler.schedule(now)`` -> ``backend.run(plan)`` -> the engine
records it.

  requests     Request, SamplingParams, RequestStatus: what a client asked for, and its state
  plan         StepPlan / ScheduledChunk (one rule for prefill and decode) and a step's features
  kv_space     the KV accounting schedulers admit against (KVSpace: reserving or paged;
               TokenKVSpace for the simulator)
  kv_blocks    paged KV accounting: blocks, block tables, growth, prefix hashes, LRU eviction
  engine       the loop: admit, schedule, run, record; virtual or wall clock
  online       the engine's online mode: a thread-safe inbox (add/abort/stop), a token listener
  clock        the virtual and wall clocks
  trace        what a run records (per request, per step), as DataFrames
  checks       the argument checks every module shares

Folders (each one's ``__init__`` says why it exists):

  schedulers/  policies: StaticBatcher, DynamicBatcher, ContinuousBatcher (never touch tensors)
  backends/    what computes a step: ModelBackend (the real model), SimBackend (a fitted cost
               model) and what only the simulator needs (cost model, calibration, decode runs)
  model/       the model itself: loading, its shape, the batched Llama step, KV cache storage
               (slots and paged blocks), sampling, profiler, one-prompt generation, the machine
               report, the CPU dtype probe, answers alone vs batched (divergence)
  workloads/   who asks what, and when: arrivals, lengths, prompts, workload files, scripted scenes
  analysis/    what only reads traces: metrics, plots, widgets, diagnosis, batches, KV usage,
               trace files, stored device profiles; claims (a notebook's checks, one verdict each)
  experiments/ the lessons' measurements: prefill stalls, load sweeps
  serve/       an OpenAI-compatible HTTP server over the online engine (python -m batchlab.serve),
               and vLLM's server on the same model as the reference (serve.vllm_ref)
  loadgen/     a load client for any OpenAI-compatible server; builds a Trace
               (python -m batchlab.loadgen)
  bench/       a tool beside the course: batchlab's engines against transformers and vLLM
  exercises/   the notebooks' exercise checkers (worked solutions live in solutions/)

Each notebook teaches one piece by writing it out first, then imports it from here.
"""

__version__ = "0.1.0"
