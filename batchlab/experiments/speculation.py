"""Speculative decoding and the batch: when checking drafts pays, measured and predicted.

The rules and their reasons: ``docs/workloads-and-metrics.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import pandas as pd

from batchlab.analysis.metrics import per_request_metrics
from batchlab.backends.base import Backend
from batchlab.checks import check_int, check_list
from batchlab.engine import Engine
from batchlab.engine_args import EngineArgs
from batchlab.requests import Request
from batchlab.schedulers import ContinuousBatcher
from batchlab.speculative import AcceptanceModel
from batchlab.schedulers.continuous import batcher_for
from batchlab.trace import Trace

RATE_ARGS = EngineArgs(max_num_seqs=256, max_num_batched_tokens=8192, enable_chunked_prefill=True)

SPEC_COLUMNS = ["batch", "config", "tok_s", "speedup", "tpot_ms", "acceptance", "tokens_per_check",
                "seconds"]


def spec_stats(trace: Trace) -> dict:
    """Drafted and accepted tokens, checks, and their ratios, over a run's requests."""
    checks = [c for r in trace.requests for c in r.spec_checks]
    drafted, accepted = sum(d for d, _ in checks), sum(a for _, a in checks)
    return {"checks": len(checks), "drafted": drafted, "accepted": accepted,
            "acceptance": accepted / drafted if drafted else float("nan"),
            "tokens_per_check": (accepted + len(checks)) / len(checks) if checks else float("nan")}


def serve_batches(make_backend: Callable[[object, int], Backend],
                  make_requests: Callable[[int], list[Request]],
                  batch_sizes: Sequence[int], specs: Mapping[object, object], min_requests: int = 1,
                  progress: Callable | None = None, rounds: int = 1) -> tuple[pd.DataFrame, dict]:
    """One row per (batch size, config) and the runs' traces by ``(batch, config)`` (see the
    module docstring). ``make_backend(spec, batch)`` builds a fresh backend from one of ``specs``'
    values (a speculative config, or whatever else it needs, such as a (config, acceptance model)
    pair; the one that is None is the baseline, run once for all the others); the configs alternate
    within each batch size, so drift on a shared CPU hits them alike. ``rounds`` > 1 repeats the
    alternation and keeps each config's fastest run (a moment of another process's work slows
    one run, never speeds one up); ``progress`` is called after every run."""
    sizes = [int(b) for b in check_list("batch_sizes", batch_sizes,
                                        "a non-empty list of batch sizes")]
    for b in sizes:
        check_int("batch size", b)
    check_int("rounds", rounds,
              hint="alternations of the configs; each config's fastest run is kept")
    baseline = _baseline(specs)
    rows, traces = [], {}
    for batch in sizes:
        requests = make_requests(max(batch, min_requests))
        best: dict[str, tuple[float, Trace]] = {}
        for _ in range(rounds):
            for name, spec in specs.items():
                seconds, trace = _serve(make_backend(spec, batch), batch, requests)
                if name not in best or seconds < best[name][0]:
                    best[name] = (seconds, trace)
                if progress is not None:
                    progress()
        for name, (seconds, trace) in best.items():
            traces[batch, name] = trace
            stats = spec_stats(trace)
            rows.append({"batch": batch, "config": name,
                         "tok_s": sum(len(r.output_ids) for r in trace.requests) / seconds,
                         "tpot_ms": per_request_metrics(trace)["tpot"].mean() * 1e3,
                         "acceptance": stats["acceptance"],
                         "tokens_per_check": stats["tokens_per_check"], "seconds": seconds})
    table = pd.DataFrame(rows, columns=[c for c in SPEC_COLUMNS if c != "speedup"])
    base = table[table["config"] == baseline].set_index("batch")["tok_s"]
    table.insert(3, "speedup", table["tok_s"] / table["batch"].map(base))
    return table, traces


def serve_rates(make_backend: Callable[[object], Backend],
                make_requests: Callable[[float], list[Request]],
                rates: Sequence[float], specs: Mapping[object,
                                                       object], args: EngineArgs = RATE_ARGS,
                progress: Callable | None = None) -> pd.DataFrame:
    """One row per (rate, config): ``make_requests(rate)`` (arrivals at ``rate`` requests/s)
    served by vLLM's scheduler under ``args`` (each left at None: ``RATE_ARGS``', an H100's
    budgets) on a fresh ``make_backend(spec)``. ``tpot_speedup``: the baseline's median TPOT /
    the config's (above 1: tokens come faster); ``mean_batch``: requests per step, what the rate
    turned into. ``progress`` is called after every run."""
    check_list("rates", rates, "a non-empty list of request rates")
    baseline = _baseline(specs)
    rows = []
    for rate in rates:
        for name, spec in specs.items():
            trace = Engine(batcher_for(args.with_defaults(RATE_ARGS)),
                           make_backend(spec)).run(make_requests(rate))
            per_request = per_request_metrics(trace)
            rows.append({"rate": rate, "config": name,
                         "tpot_ms": per_request["tpot"].median() * 1e3,
                         "ttft_ms": per_request["ttft"].median() * 1e3,
                         "mean_batch": (sum(len(s.chunks) for s in trace.steps)
                                        / max(len(trace.steps), 1)),
                         "acceptance": spec_stats(trace)["acceptance"]})
            if progress is not None:
                progress()
    table = pd.DataFrame(rows)
    base = table[table["config"] == baseline].set_index("rate")["tpot_ms"]
    table["tpot_speedup"] = table["rate"].map(base) / table["tpot_ms"]
    return table


def _baseline(specs: Mapping[object, object]) -> object:
    """The name of the config without speculation (None), which the others are compared with."""
    names = [name for name, spec in specs.items() if spec is None]
    if not names:
        raise ValueError(f"specs={list(specs)}; one config must be None (without speculation), "
                         "the baseline")
    return names[0]


def _serve(backend: Backend, batch: int, requests: list[Request]) -> tuple[float, Trace]:
    """One run at ``batch``: its seconds (wall time on the real model, the trace's span when
    simulated) and its trace."""
    engine = Engine(ContinuousBatcher(batch, max(2048, 8 * batch)), backend)
    t0 = time.perf_counter()
    trace = engine.run(requests)
    wall = time.perf_counter() - t0
    return (wall if engine.backend.kv.stores_values else trace_span(trace)), trace


def trace_span(trace: Trace) -> float:
    """Seconds from the first arrival to the last token, on the trace's clock."""
    return (max(t for r in trace.requests for t in r.token_times)
            - min(r.arrival_time for r in trace.requests))


def crossover(table: pd.DataFrame, config: str, threshold: float = 1.0) -> int | None:
    """The smallest batch size at which ``config``'s speedup falls below ``threshold``
    (None: never)."""
    rows = table[table["config"] == config].sort_values("batch")
    below = rows[rows["speedup"] < threshold]
    return None if below.empty else int(below["batch"].iloc[0])


def fit_acceptance(traces: Sequence[Trace], seed: int = 0) -> AcceptanceModel:
    """``AcceptanceModel.fit`` over the requests of measured runs with speculation."""
    requests = [r for t in traces for r in t.requests]
    return AcceptanceModel.fit([r.spec_checks for r in requests],
                               [len(r.output_ids) for r in requests], seed)
