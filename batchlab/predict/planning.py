"""Choosing a deployment: sweep the offered rate over candidates, find each one's highest rate
under a latency SLO, and price its tokens.

The rules and their reasons: ``docs/predicting-a-deployment.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache

import pandas as pd

from batchlab.checks import check_number
from batchlab.predict.deployment import Deployment, predict
from batchlab.predict.traffic import TrafficSpec


def sweep_rates(candidates: Mapping[str, Deployment], traffic_at: Callable[[float], TrafficSpec],
                rates: Iterable[float], progress: bool = False) -> pd.DataFrame:
    """One row per (candidate, rate): ``candidate``, ``num_gpus``, ``rate``, ``ttft_p50_ms``,
    ``ttft_p90_ms``, ``tpot_p50_ms``, ``tpot_p90_ms``, ``e2e_p50_ms``, ``output_tok_s``,
    ``saturated``."""
    pairs = [(name, rate) for name in candidates for rate in rates]
    if progress:
        from tqdm.auto import tqdm
        pairs = tqdm(pairs, desc="predicting", unit="run")
    return pd.DataFrame([{"candidate": name, **run_at(candidates[name], traffic_at, rate)}
                         for name, rate in pairs])


def run_at(deployment: Deployment, traffic_at: Callable[[float], TrafficSpec], rate: float) -> dict:
    """One prediction at ``rate``, as one row of ``sweep_rates``' table (without ``candidate``)."""
    return {"num_gpus": deployment.num_gpus, "rate": rate,
            **_predicted(deployment, traffic_at(rate))}


@lru_cache(maxsize=4096)
def _predicted(deployment: Deployment, traffic: TrafficSpec) -> dict:
    """The row's figures for one deployment under one seeded traffic. A prediction is a function
    of the two (a virtual clock, seeded arrivals and lengths), so each pair is simulated once per
    session: a notebook's sweep, an exercise's and its checker's share their runs (``run_at``
    copies the figures into each row, so the cached dict is never handed out)."""
    prediction = predict(deployment, traffic.generate())
    r = prediction.bench_result()
    return {"ttft_p50_ms": r["median_ttft_ms"], "ttft_p90_ms": r["p90_ttft_ms"],
            "tpot_p50_ms": r["median_tpot_ms"],
            "tpot_p90_ms": r["p90_tpot_ms"], "e2e_p50_ms": r["median_e2el_ms"],
            "output_tok_s": r["output_throughput"],
            "saturated": bool(prediction.saturation()["saturated"])}


def meets_slo(row: Mapping, slo: Mapping[str, float]) -> bool:
    """The row keeps up and every ``slo`` column is under its bound."""
    return not row["saturated"] and all(row[column] < bound for column, bound in slo.items())


def capacity(deployment: Deployment, traffic_at: Callable[[float], TrafficSpec],
             slo: Mapping[str, float],
             low: float = 1.0, high: float = 256.0, tolerance: float = 0.03,
             bracketed: bool = False) -> dict:
    """The highest rate in ``[low, high]`` at which ``deployment`` meets ``slo`` (columns of
    ``sweep_rates``' table), by bisection to ``tolerance`` of the rate: its row, with ``capped``
    (it met the SLO even at ``high``) and ``runs``. A rate of 0 means even ``low`` fails.
    ``bracketed``: the caller has seen ``low`` meet it and ``high`` miss it (a sweep), so neither
    end is predicted again unless no rate between them meets it."""
    check_number("tolerance", tolerance, strict=True)
    best, runs = None, 0
    if not bracketed:
        best, runs = run_at(deployment, traffic_at, low), 2
        if not meets_slo(best, slo):
            return {**best, "rate": 0.0, "capped": False, "runs": 1}
        top = run_at(deployment, traffic_at, high)
        if meets_slo(top, slo):
            return {**top, "capped": True, "runs": 2}
    while high - low > tolerance * low:
        mid = (low * high) ** 0.5                       # in log space: rates span decades
        runs += 1
        row = run_at(deployment, traffic_at, mid)
        if meets_slo(row, slo):
            low, best = mid, row
        else:
            high = mid
    if best is None:                                    # bracketed, and nothing above low met it
        best, runs = run_at(deployment, traffic_at, low), runs + 1
    return {**best, "capped": False, "runs": runs}


def best_rate(table: pd.DataFrame, slo: Mapping[str, float]) -> pd.DataFrame:
    """Per candidate: the highest swept ``rate`` that keeps up with every ``slo`` column under its
    bound (e.g. ``{"ttft_p90_ms": 500, "tpot_p90_ms": 50}``), its ``output_tok_s`` and
    ``num_gpus``; NaN where no swept rate does."""
    missing = [k for k in slo if k not in table.columns]
    if missing:
        raise ValueError(f"slo={dict(slo)!r}; its keys must be columns of the table: "
                         f"{missing} are not")
    ok = table.apply(lambda row: meets_slo(row, slo), axis=1)
    rows = []
    for name, group in table.groupby("candidate", sort=False):
        good = group[ok.loc[group.index]]
        best = good.loc[good["rate"].idxmax()] if len(good) else None
        rows.append({"candidate": name, "num_gpus": int(group["num_gpus"].iloc[0]),
                     "best_rate": float(best["rate"]) if best is not None else float("nan"),
                     "output_tok_s": (float(best["output_tok_s"]) if best is not None
                                      else float("nan"))})
    return pd.DataFrame(rows).set_index("candidate")


def cost_per_million_tokens(num_gpus: float, usd_per_gpu_hour: float, output_tok_s: float) -> float:
    """Dollars per million output tokens: what the GPUs cost in the time they take to make them."""
    check_number("usd_per_gpu_hour", usd_per_gpu_hour, strict=True,
                 hint="what one GPU costs you an hour")
    check_number("output_tok_s", output_tok_s, strict=True, hint="output tokens per second")
    return num_gpus * usd_per_gpu_hour / 3600 / output_tok_s * 1e6


__all__ = ["best_rate", "capacity", "cost_per_million_tokens", "meets_slo", "run_at", "sweep_rates"]
