"""What only reads traces: nothing here runs the model or a scheduler.

- ``metrics``    TTFT, TPOT, ITL, E2E, throughput, goodput and percentiles (vLLM's, LLMPerf's
                 and GuideLLM's definitions, named where they differ)
- ``plots``      timelines, occupancy, latency CDFs, load curves, step profiles
- ``widgets``    slider explorers over plain functions (ipywidgets)
- ``diagnosis``  where the waiting went: a trace against a lone request on an empty server
- ``batches``    request-level batches read back from a trace
- ``kv_usage``   what the KV memory held, step by step, against the tokens it really stored
- ``request_life`` one request's life (queue, prefill, TTFT, gaps, E2E) and its picture
- ``trace_io``   a trace saved to JSON and loaded back

Why a folder: a trace is the one thing every run leaves (the engine's, the simulator's, or a
load client's), so everything that turns traces into numbers and pictures lives together and
works on all of them.
"""
