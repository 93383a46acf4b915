"""Predict a load before sending it: the same requests, on the simulator, with a server's knobs.

``simulate_load`` serves a load's requests (their prompts, output lengths and arrival times) with
the course's continuous batcher and the simulator, under the flags a vLLM server is started with
(``EngineArgs``: ``max_num_seqs``, the token budget, chunked prefill, prefix caching on blocks of
``block_size`` tokens) and a cost model, usually one fitted from outside
(``loadgen.calibrate``). ``compare`` puts the prediction beside what the client measured.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from batchlab.analysis.metrics import latency_values, throughput
from batchlab.sim import SimBackend
from batchlab.steptime.cost_model import StepTimeModel
from batchlab.checks import check_instance
from batchlab.engine import Engine
from batchlab.engine_args import EngineArgs
from batchlab.loadgen.client import LoadRequest
from batchlab.requests import Request
from batchlab.trace import Trace
from batchlab.vllm_sim.replica import scheduler_for, simulated_engine

# vLLM V1's flags on a CPU (128 sequences, 2,048 tokens a step, chunked prefill, blocks of 128
# tokens), prefix caching off unless asked for: what simulate_load fills where its args say None.
CPU_ARGS = EngineArgs(max_num_seqs=128, max_num_batched_tokens=2048, enable_chunked_prefill=True,
                      enable_prefix_caching=False, block_size=128)


def simulate_load(cost_model: StepTimeModel, requests: list[LoadRequest],
                  args: EngineArgs = CPU_ARGS, kv_capacity_tokens: int = 46_592) -> Trace:
    """The simulator's trace of ``requests`` (token-id prompts; their ``arrival_time``) under vLLM's
    flags ``args``; each left at None takes ``CPU_ARGS``' value. The KV capacity is what the
    course's vLLM gets from 2 GiB (46,592 tokens)."""
    if not isinstance(cost_model, StepTimeModel):
        raise ValueError(f"cost_model={cost_model!r}; must be a CostModel "
                         "(e.g. calibrate_outside_in(...).cost_model)")
    check_instance("args", args, EngineArgs, "an EngineArgs")
    a = args.with_defaults(CPU_ARGS)
    reqs = []
    for r in sorted(requests, key=lambda q: q.arrival_time):
        if not isinstance(r, LoadRequest) or not isinstance(r.prompt, list):
            raise ValueError(f"request {getattr(r, 'request_id', r)!r}: simulate_load needs "
                             "LoadRequests with token-id prompts (plan_requests makes them)")
        reqs.append(Request(r.request_id, list(r.prompt), r.max_tokens, r.arrival_time))
    backend = SimBackend.for_args(cost_model, kv_capacity_tokens, a)
    return simulated_engine(scheduler_for(a), backend).run(reqs)


def load_figures(trace: Trace) -> dict[str, float]:
    """The figures a tuning lesson compares: output tokens/s, TTFT p50 and p99, ITL p50 and p99
    (s)."""
    ttft, itl = latency_values(trace, "ttft"), latency_values(trace, "itl")
    return {"output_tok_s": float(throughput(trace)["output_throughput"]),
            "ttft_p50": float(np.percentile(ttft, 50)), "ttft_p99": float(np.percentile(ttft, 99)),
            "itl_p50": float(np.percentile(itl, 50)) if len(itl) else float("nan"),
            "itl_p99": float(np.percentile(itl, 99)) if len(itl) else float("nan")}


def compare(predicted: Trace, measured: Trace) -> pd.DataFrame:
    """Predicted against measured figures (``load_figures``), with the prediction's error."""
    df = pd.DataFrame({"predicted": load_figures(predicted), "measured": load_figures(measured)})
    df["error"] = df["predicted"] / df["measured"] - 1
    return df


def newcomer_figures(trace: Trace, newcomer_id: str) -> dict[str, float]:
    """A long prompt arriving among running streams: the others' ITL p99 and longest gap (s), and
    the newcomer's TTFT (s). Works on a simulated trace and on a client's alike."""
    records = {r.request_id: r for r in trace.requests}
    if newcomer_id not in records:
        raise ValueError(f"newcomer_id={newcomer_id!r}; the trace holds {sorted(records)[:8]}...")
    newcomer = records.pop(newcomer_id)
    if not newcomer.token_times or not all(r.token_times for r in records.values()):
        raise ValueError("every request must have produced tokens (did the load finish?)")
    gaps = np.concatenate([np.diff(np.asarray(r.visible_token_times, dtype=float))
                           for r in records.values()])
    return {"others_itl_p99": float(np.percentile(gaps, 99)), "others_max_gap": float(gaps.max()),
            "newcomer_ttft": float(newcomer.visible_token_times[0] - newcomer.arrival_time)}
