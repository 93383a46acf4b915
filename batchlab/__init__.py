"""batchlab: how LLM inference servers batch requests, measured on a real model.

Module map (each notebook teaches one of these, then imports it):
  model        load the embedded SmolLM2-135M-Instruct (GGUF → cached safetensors)
  llama        the batched mixed prefill/decode step (compact Llama forward)
  kv_cache     slot-per-sequence KV cache with memory accounting
  sampling     greedy and seeded temperature/top-p sampling per request
  profiler     step time vs batch size / prefill size / context, and the bandwidth floor
  requests     Request and SamplingParams
  workloads    arrival processes, length presets, JSONL traces
  plan         StepPlan / ScheduledChunk and the KV-space accounting schedulers see
  schedulers   StaticBatcher, DynamicBatcher, ContinuousBatcher
  backends     ModelBackend (real model), SimBackend (fitted cost model)
  cost_model   the step-time formula and its fit
  engine       the loop: schedule → run → record, on a virtual or wall clock
  trace        what a run records, as DataFrames
  metrics      TTFT, TPOT, ITL, E2E, throughput, goodput, percentiles
  plots        timelines, occupancy, CDFs, load curves, step profiles
  widgets      slider explorers over plain functions
"""

__version__ = "0.1.0"
