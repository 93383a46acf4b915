"""What a cluster run returns: every replica's trace, one merged trace, and the routing table.

The rules and their reasons: ``docs/replicas-and-router.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from batchlab.cluster.driver import ClusterRun
from batchlab.cluster.replica import AdmissionLog
from batchlab.contract import EngineError
from batchlab.requests import RequestStatus
from batchlab.trace import Trace


@dataclass
class ClusterResult:
    """See the module docstring."""

    traces: list[Trace]
    merged: Trace
    routing: pd.DataFrame
    meta: dict = field(default_factory=dict)

    def requests_df(self) -> pd.DataFrame:
        """The merged trace's requests with their routing columns (NaN where not routed)."""
        return self.merged.requests_df().merge(self.routing, on="request_id", how="left")

    def replicas_df(self) -> pd.DataFrame:
        """One row per replica: what it was sent, how it ended them, how busy it was, what it
        reused."""
        rows = []
        for i, trace in enumerate(self.traces):
            statuses = pd.Series([r.status.value for r in trace.requests], dtype=object)
            sent = self.routing[self.routing["replica"] == i]
            rows.append({"replica": i, "died_at": trace.meta.get("died_at"),
                         "num_requests": len(trace.requests),
                         "num_finished": int((statuses == "finished").sum()),
                         "num_aborted": int((statuses == "aborted").sum()),
                         "num_rejected": int((statuses == "rejected").sum()),
                         "num_steps": len(trace.steps), "busy_time": trace.busy_time,
                         "prompt_tokens": int(sent["prompt_len"].sum()),
                         "admitted_hit_tokens": float(sent["admitted_hit_tokens"].sum())})
        return pd.DataFrame(rows)

    def hit_summary(self) -> dict[str, float]:
        """Prefix hits over all routed requests, as shares of their prompt tokens: predicted by the
        router, cached at routing time, reused at admission; and how often the router's
        prediction was above what the cache held (``overpredicted_share``)."""
        df = self.routing
        prompt = float(df["prompt_len"].sum())
        if prompt == 0:
            raise ValueError("no request was routed, so there are no prefix hits to summarise")
        predicted = df["predicted_hit_tokens"].astype(float)
        out = {"prompt_tokens": prompt,
               "predicted_hit_share": (float(predicted.sum()) / prompt if predicted.notna().any()
                                       else np.nan),
               "cached_at_route_share": float(df["cached_at_route_tokens"].sum()) / prompt,
               "admitted_hit_share": float(df["admitted_hit_tokens"].sum()) / prompt}
        known = predicted.notna()
        out["overpredicted_share"] = (float((predicted[known]
                                             > df["cached_at_route_tokens"][known]).mean())
                                      if known.any() else np.nan)
        return out


def routing_table(run: ClusterRun) -> pd.DataFrame:
    """The run's routing log as a table, with each request's prompt length and admission hit."""
    table = pd.DataFrame(run.log.columns)
    prompt_len = {req.request_id: req.prompt_len for req in run.workload}
    hits: dict[str, int] = {}
    for rep in run.replicas:
        kv = rep.engine.backend.kv
        if isinstance(kv, AdmissionLog):
            hits.update(kv.first_hit)
    table["prompt_len"] = table["request_id"].map(prompt_len)
    table["admitted_hit_tokens"] = table["request_id"].map(hits).astype(float)
    table["predicted_hit_tokens"] = table["predicted_hit_tokens"].astype(float)
    return table


def build_result(run: ClusterRun, meta: dict) -> ClusterResult:
    """Every replica's trace, the merged trace and the routing table; checks nobody was lost."""
    traces = [rep.finish() for rep in run.replicas]
    records = [r for trace in traces for r in trace.requests] + run.rejected
    records.sort(key=lambda r: (r.arrival_time, r.request_id))
    expected = {req.request_id for req in run.workload}
    if len(records) != len(expected) or {r.request_id for r in records} != expected:
        raise EngineError(f"the cluster ended with {len(records)} request records for "
                          f"{len(expected)} requests: some were lost or counted twice")
    merged_meta = {**meta, "num_requests": len(records), "num_replicas": len(traces),
                   "num_rejected": sum(r.status is RequestStatus.REJECTED for r in records),
                   "num_aborted": sum(r.status is RequestStatus.ABORTED for r in records),
                   "num_scrapes": run.reports.num_scrapes}
    merged = Trace(requests=records, steps=[], meta=merged_meta)
    return ClusterResult(traces, merged, routing_table(run), merged_meta)


__all__ = ["ClusterResult", "build_result", "routing_table"]
