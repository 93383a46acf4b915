"""Goodput over HTTP: SLOs in vLLM's command-line form, and a load sweep over request rates.

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import pandas as pd

from batchlab.analysis.metrics import SLO, max_rate_meeting_slo, slo_attainment, summary_row
from batchlab.checks import is_number
from batchlab.loadgen.client import LoadRequest, LoadResult, run_load

# vLLM's names -> batchlab's SLO fields
GOODPUT_KEYS = {"ttft": "ttft", "tpot": "tpot", "e2el": "e2e"}


def parse_rates(text: str) -> list[float]:
    """``"1,2,4"`` → ``[1.0, 2.0, 4.0]``: positive, finite, distinct request rates (per second)."""
    try:
        rates = [float(part) for part in str(text).split(",")]
    except ValueError:
        rates = []
    if (not rates or not all(math.isfinite(r) and r > 0 for r in rates)
            or len(set(rates)) != len(rates)):
        raise ValueError(f"rates={text!r}; must be distinct positive numbers separated by commas "
                         "(requests per second), e.g. 1,2,4")
    return rates


def parse_goodput(items: Iterable[str]) -> SLO:
    """vLLM's ``--goodput KEY:MS ...`` (``ttft``, ``tpot``, ``e2el`` in milliseconds) → ``SLO``
    (seconds)."""
    bounds: dict[str, float] = {}
    for item in items:
        key, _, ms = str(item).partition(":")
        try:
            value = float(ms)
        except ValueError:
            value = float("nan")
        if key not in GOODPUT_KEYS or not (math.isfinite(value) and value > 0):
            raise ValueError(f"goodput={item!r}; must be KEY:MS with KEY one of "
                             f"{list(GOODPUT_KEYS)} and MS a positive number of milliseconds, "
                             "e.g. ttft:500 tpot:50")
        bounds[GOODPUT_KEYS[key]] = value / 1000
    if not bounds:
        raise ValueError("goodput=[]; must give at least one KEY:MS, e.g. ttft:500")
    return SLO(**bounds)


def sweep_row(result: LoadResult, rate: float, slo: SLO | None) -> dict:
    """One rate's row: its counts, rates and latencies (``summary_row``), outcomes, and whether it
    was cut."""
    try:
        row = summary_row(result.trace, slo=slo)
    except ValueError:                   # nothing finished: no latencies, no goodput
        row = {"num_requests": len(result.records), "num_finished": 0, "num_good": 0}
    rr = result.rate_report()
    return {"rate": rate, **row, "achieved_rate": rr["achieved_rate"], "behind_plan": rr["behind"],
            "cut": result.cut, "outcomes": result.status_counts()}


def rate_sweep(url: str, make_requests: Callable[[float], list[LoadRequest]],
               rates: Iterable[float], slo: SLO | None = None, target: float = 0.9,
               on_result: Callable[[float, LoadResult], None] | None = None,
               **load_kwargs) -> tuple[pd.DataFrame, float | None]:
    """Run ``make_requests(rate)`` at each rate (lowest first); return the sweep (one row per rate,
    with ``slo_attainment`` when there is an SLO) and DistServe's goodput (None without an SLO;
    NaN when even the lowest rate missed ``target``). ``on_result`` sees each run as it ends."""
    rates = sorted(rates)
    if not rates or not all(is_number(r) and r > 0 for r in rates):
        raise ValueError(f"rates={rates!r}; must be positive numbers (requests per second)")
    rows = []
    for rate in rates:
        result = run_load(url, make_requests(rate), target_rate=rate, **load_kwargs)
        if on_result is not None:
            on_result(rate, result)
        rows.append(sweep_row(result, rate, slo))
    sweep = pd.DataFrame(rows)
    if slo is None:
        return sweep, None
    sweep["slo_attainment"] = slo_attainment(sweep)
    try:
        best = max_rate_meeting_slo(sweep, target, rate="rate")
    except ValueError:                   # every rate met it: the answer lies above the sweep
        best = float("inf")
    return sweep, best
