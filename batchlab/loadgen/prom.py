"""Reading a server's ``/metrics`` (batchlab's or vLLM's): Prometheus text → a pandas DataFrame.

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

import math
import threading
import time

import httpx
import numpy as np
import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

COLUMNS = ["family", "type", "sample", "labels", "value"]


def parse_metrics(text: str) -> pd.DataFrame:
    """One row per sample: ``family`` (the metric's name), ``type`` (counter, gauge, histogram),
    ``sample`` (e.g. ``..._bucket``, ``..._sum``, ``..._total``), ``labels`` (a dict), ``value``."""
    rows = [(family.name, family.type, s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text) for s in family.samples]
    return pd.DataFrame(rows, columns=COLUMNS)


def scrape(url: str, timeout: float = 10.0) -> pd.DataFrame:
    """``GET <url>/metrics``, parsed (``url``: the server's base URL)."""
    r = httpx.get(url.rstrip("/") + "/metrics", timeout=timeout)
    r.raise_for_status()
    return parse_metrics(r.text)


def _samples(df: pd.DataFrame, family: str, suffix: str) -> pd.DataFrame:
    rows = df[(df["family"] == family) & (df["sample"] == family + suffix)]
    if rows.empty:
        known = sorted(df["family"].unique())
        raise ValueError(f"family={family!r} has no {family + suffix!r} samples; the scrape "
                         f"holds {known}")
    return rows


def value(df: pd.DataFrame, family: str) -> float:
    """A counter's or gauge's value, summed over its label sets."""
    kinds = df.loc[df["family"] == family, "type"]
    suffix = "_total" if len(kinds) and kinds.iloc[0] == "counter" else ""
    return float(_samples(df, family, suffix)["value"].sum())


def counter_delta(before: pd.DataFrame, after: pd.DataFrame, family: str) -> float:
    """How much a counter grew between two scrapes."""
    return value(after, family) - value(before, family)


def histogram_sum(df: pd.DataFrame, family: str) -> float:
    """The sum of a histogram's observations (summed over label sets)."""
    return float(_samples(df, family, "_sum")["value"].sum())


def histogram_buckets(df: pd.DataFrame, family: str,
                      since: pd.DataFrame | None = None) -> pd.Series:
    """Cumulative counts by upper bound ``le`` (``inf`` last), summed over label sets; with
    ``since`` (an earlier scrape), only the observations made after it."""
    def counts(d: pd.DataFrame) -> pd.Series:
        rows = _samples(d, family, "_bucket")
        le = rows["labels"].map(lambda labels: float(labels["le"]))
        return rows["value"].groupby(le.to_numpy()).sum().sort_index()

    out = counts(df)
    if since is not None:
        out = out - counts(since).reindex(out.index, fill_value=0.0)
    out.index.name = "le"
    return out


def histogram_quantile(q: float, buckets: pd.Series) -> float:
    """Prometheus' ``histogram_quantile``: the bucket holding rank ``q * count``, interpolated
    linearly from its lower to its upper bound (the first bucket from 0). A rank in the ``+Inf``
    bucket gives the highest finite bound. NaN with no observations."""
    if not 0 <= q <= 1:
        raise ValueError(f"q={q!r}; must be a quantile in [0, 1] (0.99 for p99)")
    bounds, cumulative = buckets.index.to_numpy(float), buckets.to_numpy(float)
    total = cumulative[-1] if len(cumulative) else 0.0
    if total <= 0:
        return float("nan")
    rank = q * total
    i = int(np.searchsorted(cumulative, rank, side="left"))
    if math.isinf(bounds[i]):
        return float(bounds[i - 1]) if i > 0 else float("nan")
    lower = bounds[i - 1] if i > 0 else 0.0
    below = cumulative[i - 1] if i > 0 else 0.0
    inside = cumulative[i] - below
    return float(lower + (bounds[i] - lower) * ((rank - below) / inside if inside else 1.0))


def bucket_of(x: float, buckets: pd.Series) -> tuple[float, float]:
    """The bucket ``(lower, upper]`` a value falls in."""
    bounds = buckets.index.to_numpy(float)
    i = int(np.searchsorted(bounds, x, side="left"))
    return (float(bounds[i - 1]) if i > 0 else 0.0, float(bounds[min(i, len(bounds) - 1)]))


class GaugeSampler:
    """Scrapes ``<url>/metrics`` every ``interval`` seconds on a thread, keeping the ``families``'
    values (gauges such as ``vllm:num_requests_waiting``, summed over label sets) with the time::

        with GaugeSampler(server.url,
                          ["vllm:num_requests_running", "vllm:num_requests_waiting"]) as s:
            run_load(server.url, reqs)
        s.frame()              # one row per scrape: t (s since start) and one column per family

    A gauge says what holds *now*: a queue that fills and drains between two scrapes is not seen.
    """

    def __init__(self, url: str, families: list[str], interval: float = 0.25) -> None:
        if not families or not all(isinstance(f, str) for f in families):
            raise ValueError(f"families={families!r}; must be a non-empty list of metric names")
        if not (isinstance(interval, (int, float)) and interval > 0):
            raise ValueError(f"interval={interval!r}; must be seconds > 0")
        self.url, self.families, self.interval = url, list(families), float(interval)
        self.rows: list[dict] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.perf_counter()
        with httpx.Client(timeout=10.0) as client:
            while not self._stop.is_set():
                try:
                    r = client.get(self.url.rstrip("/") + "/metrics")
                    df = parse_metrics(r.text)
                    self.rows.append({"t": time.perf_counter() - t0,
                                      **{f: value(df, f) for f in self.families}})
                except (httpx.HTTPError, ValueError) as e:
                    self.error = f"{type(e).__name__}: {e}"
                self._stop.wait(self.interval)

    def __enter__(self) -> "GaugeSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def frame(self) -> pd.DataFrame:
        """The samples (``t`` and one column per family); raises if no scrape succeeded."""
        if not self.rows:
            raise RuntimeError(f"no scrape of {self.url}/metrics succeeded "
                               f"({self.error or 'none was made'})")
        return pd.DataFrame(self.rows)
