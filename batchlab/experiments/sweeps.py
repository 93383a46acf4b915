"""Load sweeps: serve the same workload at several request rates under several policies.

The rules and their reasons: ``docs/workloads-and-metrics.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import pandas as pd

from batchlab.analysis.metrics import SLO, summary_row, throughput
from batchlab.backends.base import Backend
from batchlab.checks import (check_bool, check_callable, check_instance, check_list, check_number,
                             fail)
from batchlab.engine import Engine
from batchlab.requests import Request
from batchlab.schedulers.base import Scheduler
from batchlab.trace import Trace
from batchlab.workloads import scale_arrivals

WorkloadFn = Callable[[float], Sequence[Request]]
SchedulerFactory = Callable[[], Scheduler]
BackendFactory = Callable[[], Backend]


def _check_rates(rates: Iterable[float]) -> list[float]:
    """Rates must be a non-empty collection of finite numbers > 0 (requests per second)."""
    values = check_list("rates", rates, "a non-empty list of request rates",
                        hint="requests/s, e.g. [0.5, 1, 2]")
    for i, r in enumerate(values):
        check_number(f"rates[{i}]", r, strict=True, hint="requests per second")
    return [float(r) for r in values]


def _check_policies(policies: Mapping[str, SchedulerFactory]) -> dict[str, SchedulerFactory]:
    """Policies must be a non-empty dict of {name: function that builds a new scheduler}."""
    if not isinstance(policies, Mapping) or not policies:
        fail("policies", policies, "a non-empty dict of {name: scheduler factory}",
             "e.g. {'continuous': lambda: ContinuousBatcher(max_num_seqs=16)}")
    for name, factory in policies.items():
        check_instance("policy name", name, str, "a string")
        if isinstance(factory, Scheduler):
            fail(f"policies[{name!r}]", factory, "a factory, not a scheduler object",
                 "a scheduler keeps its queues between runs, so the sweep needs a function that "
                 f"builds a fresh one, e.g. lambda: {factory!r}")
        check_callable(f"policies[{name!r}]", factory, "a function that returns a new Scheduler")
    return dict(policies)


def run_point(requests: Sequence[Request], scheduler: Scheduler, backend: Backend,
              slo: SLO | Mapping[str, float] | None = None,
              percentiles: Iterable[float] = (50, 90, 99)) -> tuple[dict[str, float], Trace]:
    """Serve ``requests`` once; return ``metrics.summary_row`` of the run and its trace."""
    check_instance("scheduler", scheduler, Scheduler, "a batchlab Scheduler",
                   hint="what the policy factory returned")
    check_instance("backend", backend, Backend, "a batchlab Backend",
                   hint="SimBackend, ModelBackend: what backend_factory returned")
    trace = Engine(scheduler, backend).run(list(requests))
    return summary_row(trace, slo=slo, percentiles=percentiles), trace


def capacity(requests: Sequence[Request], make_scheduler: SchedulerFactory,
             backend_factory: BackendFactory) -> float:
    """Requests per second a server sustains: serve ``requests`` all arriving at ``t = 0``.

    With everyone already waiting, the server never idles and every step is as full as the
    policy allows, so finished requests / duration is the most it can do for these requests.
    (A slight underestimate: the last few requests run in a half-empty batch.) A load sweep uses
    it to place its rates: a fraction of capacity means the same thing on any machine.
    """
    if isinstance(make_scheduler, Scheduler):
        fail("make_scheduler", make_scheduler, "a function that returns a new Scheduler",
             "not a scheduler object, which keeps its queues between runs")
    check_callable("make_scheduler", make_scheduler, "a function that returns a new Scheduler")
    check_callable("backend_factory", backend_factory, "a function that returns a new Backend")
    at_once = scale_arrivals(requests, 0.0)
    scheduler, backend = make_scheduler(), backend_factory()
    check_instance("make_scheduler()", scheduler, Scheduler, "a batchlab Scheduler")
    trace = Engine(scheduler, backend).run(at_once)
    return float(throughput(trace)["request_throughput"])


def load_sweep(workload_fn: WorkloadFn, rates: Iterable[float],
               policies: Mapping[str, SchedulerFactory], backend_factory: BackendFactory,
               slo: SLO | Mapping[str, float] | None = None, progress: bool = True,
               percentiles: Iterable[float] = (50, 90, 99),
               keep_traces: bool = False) -> pd.DataFrame:
    """Serve ``workload_fn(rate)`` at every rate under every policy; one row per (policy, rate).

    ``workload_fn(rate)``: the requests to serve at ``rate`` requests/s (sorted by arrival).
    ``policies``: ``{name: factory}``, each factory returning a *new* scheduler.
    ``backend_factory()``: a new backend for each run
    (``lambda: SimBackend(cost, kv_capacity_tokens=...)``; for the real model, a function that
    returns the same ``ModelBackend`` works too, since the engine checks its cache is empty and
    resets it between runs).
    ``slo``: bounds in seconds (``SLO`` or a dict like ``{"ttft": 0.5}``) to add ``num_good`` and
    ``goodput``. ``progress``: a tqdm bar over the runs. ``keep_traces``: also keep every run's
    ``Trace`` in ``df.attrs["traces"]``, a dict keyed by ``(policy, rate)`` (off by default: a
    large sweep's traces take a lot of memory).

    Columns: ``policy``, ``request_rate``, then every key of ``metrics.summary_row``
    (``num_finished``, ``request_throughput``, ``goodput`` with an SLO, ``ttft_p50``,
    ``ttft_p99``, ``itl_p50``, ``e2e_p99``, ``busy_share``...). Latencies are in seconds.
    """
    rate_list = _check_rates(rates)
    policy_factories = _check_policies(policies)
    check_callable("workload_fn", workload_fn, "a function rate -> list of Request")
    check_callable("backend_factory", backend_factory, "a function that returns a new Backend",
                   hint="e.g. lambda: SimBackend(cost, kv_capacity_tokens=...)")
    if slo is not None:
        slo = SLO.coerce(slo)
    check_bool("keep_traces", keep_traces)

    # Each rate's workload is built once and served under every policy (the engine copies it).
    workloads = {rate: list(workload_fn(rate)) for rate in rate_list}
    points = [(name, rate) for name in policy_factories for rate in rate_list]
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(points), unit="run", desc="load sweep")
    rows, traces = [], {}
    try:
        for name, rate in points:
            try:
                row, trace = run_point(workloads[rate], policy_factories[name](), backend_factory(),
                                       slo, percentiles)
            except ValueError as err:
                raise ValueError(f"policy {name!r} at rate {rate:g} req/s: {err}") from err
            rows.append({"policy": name, "request_rate": rate, **row})
            if keep_traces:
                traces[(name, rate)] = trace
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    table = pd.DataFrame(rows).infer_objects()
    if keep_traces:
        table.attrs["traces"] = traces
    return table
