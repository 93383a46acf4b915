"""batchlab: how LLM inference servers batch requests, measured on a real model.

Module map (each notebook teaches one of these, then imports it):
  environment  what machine this is (device, threads, memory, load)
  model        load the embedded SmolLM2-135M-Instruct (GGUF → cached safetensors)
  generate     greedy generation for one prompt with the batched step
  llama        the batched mixed prefill/decode step (compact Llama forward)
  kv_cache     slot-per-sequence KV cache with memory accounting
  kv_blocks    paged KV accounting: blocks, block tables, growth, prefix hashes, LRU eviction
  paged_kv_cache  the paged cache's block pool, read and written through block tables
  model_shapes models' KV shapes as data: bytes per token, sequences a budget holds
  kv_usage     what a trace's KV memory held against what it stored, step by step
  sampling     greedy and seeded temperature/top-p sampling per request
  profiler     step time vs batch size / prefill size / context, and the bandwidth floor
  requests     Request and SamplingParams
  workloads    arrival processes, length presets, JSONL traces
  scripted_workloads  requests at exact times and lengths, for staged scenes
  plan         StepPlan / ScheduledChunk and the KV-space accounting schedulers see
  schedulers   StaticBatcher, DynamicBatcher, ContinuousBatcher
  backends     ModelBackend (real model), SimBackend (fitted cost model)
  cost_model   the step-time formula and its fit
  calibration  measure real steps, fit the cost model
  engine       the loop: schedule → run → record, on a virtual or wall clock
  trace        what a run records, as DataFrames
  trace_io     save a Trace to JSON and load it back
  batches      request-level batches read back from a trace
  prefill_stall  what a newcomer's long prompt does to running decodes
  sweeps       load sweeps over rates and policies
  diagnosis    where the waiting went: a trace against an empty server
  bench        batchlab's engines against transformers, side by side
  metrics      TTFT, TPOT, ITL, E2E, throughput, goodput, percentiles
  plots        timelines, occupancy, CDFs, load curves, step profiles
  widgets      slider explorers over plain functions
  exercises    the notebooks' exercise checkers (solutions live in solutions/)
"""

__version__ = "0.1.0"
