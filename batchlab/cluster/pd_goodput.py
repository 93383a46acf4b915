"""Where disaggregation pays: the same GPUs as colocated replicas or as prefill and decode pools.

The rules and their reasons: ``docs/replicas-and-router.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pandas as pd

from batchlab.analysis.metrics import SLO, max_rate_meeting_slo, per_request_metrics
from batchlab.checks import check_int, fail
from batchlab.cluster.cluster import Cluster, ClusterConfig
from batchlab.cluster.disaggregated import DisaggregatedCluster, DisaggregatedConfig
from batchlab.cluster.replica import ReplicaSpec
from batchlab.workloads import make_workload


def layouts(num_gpus: int) -> list[str]:
    """``"colocated"`` and every split of ``num_gpus`` into prefill and decode workers."""
    check_int("num_gpus", num_gpus, minimum=2, hint="a split needs a prefill and a decode GPU")
    return ["colocated"] + [f"{p}P{num_gpus - p}D" for p in range(1, num_gpus)]


def _cluster(layout: str, num_gpus: int, model: str, device: str, link: str, policy: str):
    if layout == "colocated":
        return Cluster(ClusterConfig(num_gpus, policy=policy),
                       ReplicaSpec.for_device(model, device))
    if layout not in layouts(num_gpus):
        fail("layout", layout, f"one of {layouts(num_gpus)}")
    p, d = (int(x) for x in layout[:-1].split("P"))
    return DisaggregatedCluster.for_device(model, device,
                                           DisaggregatedConfig(p, d, link, policy, policy))


def attainment_table(model: str, device: str, num_gpus: int, rates: Sequence[float],
                     slo: SLO | Mapping, num_requests: int = 400, prompt_len=None, output_len=None,
                     layout_names: Sequence[str] | None = None,
                     link: str = "infiniband-ndr", policy: str = "least_outstanding",
                     seed: int = 0) -> pd.DataFrame:
    """One row per layout and rate: ``num_good`` of ``num_requests`` met ``slo``, with the TTFT and
    TPOT medians and 90th percentiles (seconds). ``prompt_len``, ``output_len``: as
    ``make_workload`` takes them (an int or a ``Range``)."""
    slo = SLO.coerce(slo)
    rows = []
    for layout in layout_names or layouts(num_gpus):
        cluster = _cluster(layout, num_gpus, model, device, link, policy)
        for rate in rates:
            reqs = make_workload(num_requests, prompt_len=prompt_len, output_len=output_len,
                                 rate=rate, seed=seed)
            per = per_request_metrics(cluster.run(reqs).merged)
            rows.append({"layout": layout, "request_rate": float(rate),
                         "num_requests": num_requests, "num_good": int(slo.met(per).sum()),
                         "ttft_p50": per["ttft"].median(), "ttft_p90": per["ttft"].quantile(0.9),
                         "tpot_p50": per["tpot"].median(), "tpot_p90": per["tpot"].quantile(0.9)})
    return pd.DataFrame(rows)


def goodput_by_layout(table: pd.DataFrame, num_gpus: int, target: float = 0.9) -> pd.DataFrame:
    """Each layout's DistServe goodput (req/s) and per GPU, from ``attainment_table``. ``inf``:
    the target was met at every swept rate (sweep higher); NaN: not even at the lowest."""
    rows = []
    for layout, sweep in table.groupby("layout", sort=False):
        try:
            best = max_rate_meeting_slo(sweep, target)
        except ValueError:
            best = math.inf
        rows.append({"layout": layout, "goodput": best, "goodput_per_gpu": best / num_gpus})
    return pd.DataFrame(rows).set_index("layout")


__all__ = ["attainment_table", "goodput_by_layout", "layouts"]
