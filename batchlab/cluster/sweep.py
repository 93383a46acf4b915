"""Sweeps: many pure, seeded runs over a grid of settings, in this process or on Ray.

The rules and their reasons: ``docs/replicas-and-router.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from batchlab.analysis.metrics import summary_row
from batchlab.checks import check_bool, check_int
from batchlab.cluster.cluster import Cluster, ClusterConfig
from batchlab.cluster.replica import ReplicaSpec
from batchlab.workloads.sessions import SessionShape, make_sessions

PACKAGE_ROOT = Path(__file__).resolve().parents[2]     # the folder that holds the batchlab package
RunFn = Callable[..., Mapping[str, Any]]


def grid(**axes: Sequence[Any]) -> list[dict[str, Any]]:
    """Every combination of the given values, as a list of settings (the last axis varies
    fastest)."""
    for name, values in axes.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise ValueError(f"{name}={values!r}; must be a non-empty list of values")
    names = list(axes)
    return [dict(zip(names, combo)) for combo in itertools.product(*axes.values())]


def call_point(fn: RunFn, point: Mapping[str, Any]) -> dict[str, Any]:
    """Run one point and check it returned a row (a dict); a run that raises becomes a row with
    its ``error`` (a run that returns something else is the sweep's mistake, and raises)."""
    try:
        row = fn(**point)
    except Exception as err:   # the run's own failure: reported in its row, the others go on
        return {"error": f"{type(err).__name__}: {err}"}
    if not isinstance(row, Mapping):
        raise ValueError(f"{getattr(fn, '__name__', fn)}({dict(point)}) returned "
                         f"{type(row).__name__}, "
                         "not a dict: a sweep's runs return small rows, never traces")
    return dict(row)


def run_sweep(fn: RunFn, points: Sequence[Mapping[str, Any]], *, use_ray: bool = False,
              num_cpus: int | None = None) -> pd.DataFrame:
    """``fn(**point)`` for every point; one row per point: the point's settings, then ``fn``'s row.

    ``fn`` must be a module-level function (Ray sends it to workers by name) that depends only on
    its arguments. ``use_ray``: run the points as Ray tasks (see the module docstring).
    """
    if not callable(fn):
        raise ValueError(f"fn={fn!r}; must be a function settings -> dict")
    if isinstance(points, Mapping) or not isinstance(points, Sequence) or not points:
        raise ValueError("points must be a non-empty list of settings (dicts); "
                         "grid(...) builds one")
    if not all(isinstance(p, Mapping) for p in points):
        raise ValueError("every point must be a dict of settings")
    check_bool("use_ray", use_ray)
    check_int("num_cpus", num_cpus, allow_none=True, hint="None: what Ray detects")
    rows = run_on_ray(fn, points, num_cpus) if use_ray else [call_point(fn, p) for p in points]
    failed = sum("error" in row for row in rows)
    if failed:
        print(f"run_sweep: {failed} of {len(rows)} points failed; their rows hold the error "
              "(column 'error')")
    return pd.DataFrame([{**p, **row} for p, row in zip(points, rows)])


@contextlib.contextmanager
def _workers_import_this_batchlab() -> Iterator[None]:
    """Ray's local workers inherit the environment of the Ray processes ``ray.init`` starts; put
    this batchlab first on their ``PYTHONPATH`` while they start."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), before) if p)
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def start_ray(num_cpus: int | None = None) -> bool:
    """Join ``RAY_ADDRESS``'s cluster, or start Ray in this process; False if already running."""
    import ray
    if ray.is_initialized():
        return False
    if os.environ.get("RAY_ADDRESS"):
        # this batchlab, on every worker
        ray.init(runtime_env={"py_modules": [str(PACKAGE_ROOT / "batchlab")]})
        return True
    with _workers_import_this_batchlab():
        # None: Ray detects them
        ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level="warning")
    return True


def run_on_ray(fn: RunFn, points: Sequence[Mapping[str, Any]],
               num_cpus: int | None = None) -> list[dict]:
    """Every point as one Ray task (one CPU each); rows in the order of ``points``."""
    try:
        import ray
    except ImportError:
        raise ImportError("use_ray=True needs Ray: pip install -r requirements.txt "
                          "(it pins ray)") from None
    started = start_ray(num_cpus)
    try:
        task = ray.remote(num_cpus=1)(call_point)
        refs = [task.remote(fn, dict(p)) for p in points]
        return [_row_of(ray, ref) for ref in refs]
    finally:
        if started:
            ray.shutdown()


def _row_of(ray, ref) -> dict:
    """A task's row, or its failure (a worker that died, a row that was not a dict) as a row."""
    try:
        return ray.get(ref)
    except Exception as err:   # RayTaskError and its kin: this point failed, the others go on
        cause = getattr(err, "cause", None) or err
        return {"error": f"{type(cause).__name__}: {cause}"}


def cluster_point(*, policy: str = "cache_aware", num_replicas: int = 4, seed: int = 0,
                  num_sessions: int = 100, session_rate: float = 10.0, num_system_prompts: int = 4,
                  system_prompt_len: int = 256, kv_capacity_tokens: int | None = 20_000,
                  model: str = "Llama-3-8B", device: str = "H100") -> dict[str, float]:
    """One cluster run of a session workload, reduced to a row: the service's counts, rates and
    latencies (``metrics.summary_row`` of the merged trace), prefix hits predicted and actual,
    and how unevenly the requests were spread (most requests on a replica / mean).
    ``kv_capacity_tokens``: each replica's KV cache (None: what fits on the device). A run is a
    function of its settings (seeded traffic, a virtual clock), so each is simulated once per
    process and repeated settings get a copy of its row (an exercise's checker reuses the sweep
    its solution ran)."""
    return dict(_cluster_row(policy, num_replicas, seed, num_sessions, session_rate,
                             num_system_prompts,
                             system_prompt_len, kv_capacity_tokens, model, device))


@functools.lru_cache(maxsize=512)
def _cluster_row(policy: str, num_replicas: int, seed: int, num_sessions: int, session_rate: float,
                 num_system_prompts: int, system_prompt_len: int, kv_capacity_tokens: int | None,
                 model: str, device: str) -> dict[str, float]:
    """``cluster_point``'s run (its arguments in order), simulated."""
    workload = make_sessions(SessionShape(num_sessions, session_rate=session_rate,
                                          num_system_prompts=num_system_prompts,
                                          system_prompt_len=system_prompt_len), seed=seed)
    spec = dataclasses.replace(ReplicaSpec.for_device(model, device), seed=seed)
    if kv_capacity_tokens is not None:
        spec = dataclasses.replace(spec, kv_capacity_tokens=kv_capacity_tokens)
    result = Cluster(ClusterConfig(num_replicas, policy, seed=seed), spec).run(workload.requests,
                                                                               workload.session_of)
    counts = result.routing["replica"].value_counts().reindex(range(num_replicas), fill_value=0)
    row = {k: v for k, v in summary_row(result.merged).items()
           if not k.startswith(("num_steps", "busy", "mean_num", "slot_waste"))}
    return {**row, **result.hit_summary(), "imbalance": float(counts.max() / counts.mean())}


__all__ = ["PACKAGE_ROOT", "call_point", "cluster_point", "grid", "run_on_ray", "run_sweep",
           "start_ray"]
