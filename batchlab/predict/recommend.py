"""``--recommend``: the cheapest vLLM deployments that meet a latency SLO at a rate, searched.

The rules and their reasons: ``docs/predicting-a-deployment.md``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from batchlab.steptime.device_presets import load_device_presets
from batchlab.steptime.kv_links import kv_link
from batchlab.checks import check_choice, check_int, check_number, fail
from batchlab.predict.deployment import Deployment, predict, predict_disaggregated
from batchlab.engine_args import EngineArgs
from batchlab.predict.traffic import Traffic
from batchlab.shapes import model_shape

TP_DEGREES = (1, 2, 4, 8)
# (max_num_seqs, budget); None: default
KNOBS = ((None, None), (256, None), (64, None), (None, 2048), (64, 2048))


@dataclass(frozen=True)
class SLO:
    """Bounds on TTFT and TPOT (ms, None: unbounded) at one ``percentile``."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    percentile: float = 99.0

    def __post_init__(self) -> None:
        if self.ttft_ms is None and self.tpot_ms is None:
            fail("slo_ttft_ms", None, "a bound, or slo_tpot_ms one",
                 "--slo-ttft-ms and/or --slo-tpot-ms")
        for name in ("ttft_ms", "tpot_ms"):
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name), strict=True,
                             hint=f"--slo-{name.replace('_', '-')}")
        check_number("percentile", self.percentile, strict=True, hint="--slo-percentile")
        if self.percentile >= 100:
            fail("percentile", self.percentile, "a number in (0, 100)", "--slo-percentile")

    def bounds(self) -> dict[str, float]:
        return {m: b for m, b in (("ttft", self.ttft_ms), ("tpot", self.tpot_ms)) if b is not None}

    def margins(self, result: Mapping) -> dict[str, float]:
        """Per bounded metric, how far under its bound the prediction is (0.2: 20% to spare)."""
        return {m: 1 - result[f"p{self.percentile:g}_{m}_ms"] / b for m, b in self.bounds().items()}

    def describe(self) -> str:
        return " and ".join(f"{m.upper()} p{self.percentile:g} < {b:g} ms"
                            for m, b in self.bounds().items())


def every_rth(traffic: Traffic, r: int) -> Traffic:
    """Every ``r``-th request: one replica's share of an evenly split load."""
    return dataclasses.replace(traffic, arrival_s=traffic.arrival_s[::r],
                               input_tokens=traffic.input_tokens[::r],
                               output_tokens=traffic.output_tokens[::r],
                               prefix_group=traffic.prefix_group[::r],
                               prefix_len=traffic.prefix_len[::r])


def meets(deployment: Deployment, traffic: Traffic, slo: SLO,
          split: tuple[int, int, str] | None = None
          ) -> tuple[bool, dict]:
    """Whether ``deployment`` serving ``traffic`` keeps up and meets ``slo``; its result keys.
    ``split``: ``(num_prefill, num_decode, link)`` copies of it as a disaggregated pair of pools."""
    percentiles = (50, slo.percentile)
    prediction = (predict(deployment, traffic, percentiles) if split is None else
                  predict_disaggregated(deployment, deployment, *split[:2], traffic, split[2],
                                        percentiles))
    result = prediction.bench_result()
    ok = not prediction.saturation()["saturated"] and min(slo.margins(result).values()) >= 0
    return ok, result


def fewest_replicas(make, traffic: Traffic, slo: SLO, most: int) -> tuple[int | None, int]:
    """The fewest replicas (1..``most``) whose one-replica share meets ``slo``, by bisection;
    None if even ``most`` do not. Also how many predictions it took."""
    lo, hi, runs = 1, most, 1
    if not meets(make(1), every_rth(traffic, most), slo)[0]:
        return None, runs
    while lo < hi:
        mid = (lo + hi) // 2
        runs += 1
        if meets(make(1), every_rth(traffic, mid), slo)[0]:
            hi = mid
        else:
            lo = mid + 1
    return lo, runs


def configurations(model, gpus: Sequence[str], max_gpus: int, base: EngineArgs,
                   vllm_version: str | None):
    """Every (gpu, tp, args) whose deployment vLLM would start (the rest are skipped)."""
    seen = set()
    for gpu in gpus:
        for tp in (t for t in TP_DEGREES if t <= max_gpus):
            for seqs, budget in KNOBS:
                args = dataclasses.replace(
                    base, max_num_seqs=seqs or base.max_num_seqs,
                    max_num_batched_tokens=budget or base.max_num_batched_tokens)
                try:
                    resolved = Deployment(model, gpu, tp, args=args,
                                          vllm_version=vllm_version).resolved_args
                except ValueError:
                    # does not split, does not fit, or vLLM would refuse
                    continue
                if (gpu, tp, resolved) not in seen:
                    seen.add((gpu, tp, resolved))
                    yield gpu, tp, resolved


def cheapest_split(deployment: Deployment, traffic: Traffic, slo: SLO, max_gpus: int, link: str):
    """The fewest GPUs split as prefill and decode copies of ``deployment`` that meet ``slo``
    (from two GPUs up; for each total, decode-heavy splits first): ``(num_prefill, num_decode,
    result)`` or None; and how many predictions it took."""
    tp, runs = deployment.tensor_parallel_size, 0
    for copies in range(2, max_gpus // tp + 1):
        for num_prefill in range(1, copies):
            runs += 1
            ok, result = meets(deployment, traffic, slo, (num_prefill, copies - num_prefill, link))
            if ok:
                return (num_prefill, copies - num_prefill, result), runs
    return None, runs


def recommend(model, gpus: Sequence[str], traffic: Traffic, slo: SLO, max_gpus: int = 8,
              top: int = 5,
              args: EngineArgs | None = None, usd_per_gpu_hour: Mapping[str, float] | None = None,
              vllm_version: str | None = None,
              pd_link: str | None = None) -> tuple[pd.DataFrame, dict]:
    """The ``top`` cheapest deployments meeting ``slo`` for ``traffic`` (see the module docstring),
    and what the search did (candidates predicted, seconds)."""
    check_int("max_gpus", max_gpus, hint="--max-gpus")
    check_int("top", top)
    presets = sorted(load_device_presets())
    # named here: a bad one would only find nothing
    for gpu in gpus:
        check_choice("gpu", gpu, presets, hint="--gpu, comma-separated presets")
    if isinstance(model, str):
        model_shape(model)                                 # an unknown model, named
    if pd_link is not None:
        kv_link(pd_link)
    wall, runs, found = time.perf_counter(), 0, []
    for gpu, tp, f in configurations(model, gpus, max_gpus, args or EngineArgs(), vllm_version):
        def make(replicas: int, gpu=gpu, tp=tp, f=f) -> Deployment:
            return Deployment(model, gpu, tp, replicas, args=f, vllm_version=vllm_version)
        replicas, n = fewest_replicas(make, traffic, slo, max_gpus // tp)
        runs += n
        if replicas is not None:
            found.append((tp * replicas, gpu, tp, replicas, f, make))
    if not found:
        fail("slo", slo.describe(),
             f"met by some deployment of at most {max_gpus} GPUs of {list(gpus)}",
             f"at {traffic.describe().split(' (')[0]}; raise --max-gpus or loosen the SLO")
    rows = []
    for num_gpus, gpu, tp, replicas, f, make in sorted(found, key=lambda c: c[0])[:3 * top]:
        for r in (replicas, replicas + 1):          # whole: every replica behind the router
            if tp * r > max_gpus:
                break
            runs += 1
            ok, result = meets(make(r), traffic, slo)
            if ok:
                rows.append(row(gpu, tp, r, f, result, slo, usd_per_gpu_hour, "replicas"))
                break
    # prefill/decode splits, vLLM's default knobs
    if pd_link is not None:
        for gpu, tp in sorted({(gpu, tp) for _, gpu, tp, *_ in found}):
            deployment = Deployment(model, gpu, tp, args=args or EngineArgs(),
                                    vllm_version=vllm_version)
            split, n = cheapest_split(deployment, traffic, slo, max_gpus, pd_link)
            runs += n
            if split is not None:
                rows.append(row(gpu, tp, split[0] + split[1], deployment.resolved_args, split[2],
                                slo, usd_per_gpu_hour, f"P/D {split[0]}:{split[1]}"))
    if not rows:
        fail("slo", slo.describe(),
             f"met by some deployment of at most {max_gpus} GPUs of {list(gpus)}",
             "whole, behind the router (its replicas' shares met it alone); raise --max-gpus")
    table = pd.DataFrame(rows)
    cost = ("usd_per_M_tokens"
            if "usd_per_M_tokens" in table and table["usd_per_M_tokens"].notna().all()
            else "gpu_hours_per_M_tokens")
    table = (table.sort_values([cost, "num_gpus"])
             .drop_duplicates(["gpu", "tp", "layout", "replicas"]))  # cheapest knobs
    table = table.head(top).reset_index(drop=True)
    return table, {"predictions": runs, "seconds": time.perf_counter() - wall}


def row(gpu: str, tp: int, replicas: int, args: EngineArgs, result: Mapping, slo: SLO,
        usd_per_gpu_hour: Mapping[str, float] | None, layout: str) -> dict:
    """One recommendation: the deployment (``replicas`` copies of TP ``tp``, as replicas behind a
    router or a P/D split), its percentiles and margins, its price per token."""
    gpu_hours = tp * replicas / (result["output_throughput"] * 3600 / 1e6)
    out = {"gpu": gpu, "tp": tp, "layout": layout, "replicas": replicas, "num_gpus": tp * replicas,
           "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
           f"ttft_p{slo.percentile:g}_ms": result[f"p{slo.percentile:g}_ttft_ms"],
           f"tpot_p{slo.percentile:g}_ms": result[f"p{slo.percentile:g}_tpot_ms"],
           **{f"{m}_margin": v for m, v in slo.margins(result).items()},
           "gpu_hours_per_M_tokens": gpu_hours}
    if usd_per_gpu_hour and gpu in usd_per_gpu_hour:
        out["usd_per_M_tokens"] = gpu_hours * usd_per_gpu_hour[gpu]
    return out


__all__ = ["KNOBS", "SLO", "TP_DEGREES", "every_rth", "recommend"]
