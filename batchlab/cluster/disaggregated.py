"""Prefill here, decode there: a disaggregated cluster on one virtual clock.

The rules and their reasons: ``docs/replicas-and-router.md``.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from batchlab.steptime.kv_links import KV_LINKS, KVLink, kv_link
from batchlab.checks import check_int, check_number, fail, is_int
from batchlab.cluster.driver import ClusterRun
from batchlab.cluster.policies import check_policy, make_router
from batchlab.cluster.replica import Replica, ReplicaSpec
from batchlab.cluster.results import ClusterResult, build_result
from batchlab.cluster.router import Router
from batchlab.contract import EngineError, fresh_workload
from batchlab.engine import Engine
from batchlab.loop import gc_paused
from batchlab.requests import FinishReason, KVTransfer, Request, RequestStatus
from batchlab.trace import RequestRecord, Trace


@dataclass(frozen=True)
class DisaggregatedConfig:
    """How many prefill and decode workers (any P:D ratio), the link between them, each pool's
    routing policy (one of ``ROUTING_POLICIES``) and the routers' seed."""

    num_prefill: int
    num_decode: int
    link: str | KVLink = "infiniband-ndr"
    prefill_policy: str = "least_outstanding"
    decode_policy: str = "least_outstanding"
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("num_prefill", self.num_prefill,
                  hint="a disaggregated cluster needs a prefill worker")
        check_int("num_decode", self.num_decode,
                  hint="a disaggregated cluster needs a decode worker")
        kv_link(self.link)
        check_policy(self.prefill_policy)
        check_policy(self.decode_policy)
        check_int("seed", self.seed, minimum=0)


@dataclass
class DisaggregatedResult:
    """``prefill`` and ``decode``: each pool's ``ClusterResult`` (its requests are the prefill
    copies, ``max_tokens=1``, and the decode copies). ``merged``: one record per request of the
    workload, as the client saw it (the decode worker's record; the prefill worker's for a
    request that never reached decode). ``transfers``: one row per KV hand-off."""

    prefill: ClusterResult
    decode: ClusterResult
    merged: Trace
    transfers: pd.DataFrame
    meta: dict = field(default_factory=dict)

    def requests_df(self) -> pd.DataFrame:
        """The merged trace's requests with their hand-off columns (NaN where the KV never left)."""
        return self.merged.requests_df().merge(self.transfers, on="request_id", how="left")


class DisaggregatedCluster:
    """Prefill workers built from ``prefill`` and decode workers from ``decode`` (each a
    ``ReplicaSpec``, or a function ``index -> Engine`` on the virtual clock whose policy takes
    transferred KV, such as a predicted vLLM deployment's ``Deployment.engine``; ``decode``
    defaults to ``prefill``), the KV crossing ``config.link`` at ``kv_bytes_per_token`` bytes per
    prompt token."""

    def __init__(self, config: DisaggregatedConfig, prefill: ReplicaSpec | Callable[[int], Engine],
                 kv_bytes_per_token: float,
                 decode: ReplicaSpec | Callable[[int], Engine] | None = None) -> None:
        if not isinstance(config, DisaggregatedConfig):
            raise ValueError(f"config={config!r}; must be a DisaggregatedConfig")
        decode = prefill if decode is None else decode
        for name, spec in (("prefill", prefill), ("decode", decode)):
            if not isinstance(spec, ReplicaSpec) and not callable(spec):
                raise ValueError(f"{name}={spec!r}; must be a ReplicaSpec or a function "
                                 "index -> Engine")
        check_number("kv_bytes_per_token", kv_bytes_per_token, strict=True)
        self.config, self.link = config, kv_link(config.link)
        self.build = {pool: spec.build if isinstance(spec, ReplicaSpec) else spec
                      for pool, spec in (("prefill", prefill), ("decode", decode))}
        self.kv_bytes_per_token = float(kv_bytes_per_token)
        self.kills: list[tuple[float, str, int]] = []

    def kill(self, pool: str, replica: int, at: float) -> None:
        """Worker ``replica`` of ``pool`` (``"prefill"`` or ``"decode"``) dies at time ``at`` in
        every later run (see the module docstring)."""
        if pool not in ("prefill", "decode"):
            fail("pool", pool, "'prefill' or 'decode'")
        size = self.config.num_prefill if pool == "prefill" else self.config.num_decode
        if not is_int(replica) or not 0 <= replica < size:
            fail("replica", replica, f"an int in 0..{size - 1} (the {pool} pool has {size})")
        check_number("at", at, hint="seconds on the run's clock")
        self.kills.append((float(at), pool, int(replica)))

    @classmethod
    def for_device(cls, model: str, device: str, config: DisaggregatedConfig,
                   **replica_kwargs: Any) -> "DisaggregatedCluster":
        """Both pools on ``device`` (a GPU preset) serving ``model`` as vLLM would
        (``ReplicaSpec.for_device``), the KV priced at the model's bytes per token in its dtype."""
        spec = ReplicaSpec.for_device(model, device, **replica_kwargs)
        return cls(config, spec, spec.vllm.kv_bytes_per_token)

    def __repr__(self) -> str:
        c = self.config
        return (f"DisaggregatedCluster({c.num_prefill}P:{c.num_decode}D, "
                f"link={self.link.name!r}, kills={self.kills})")

    def run(self, requests: Sequence[Request],
            session_of: Mapping[str, str] | None = None) -> DisaggregatedResult:
        """Serve ``requests`` (sorted by arrival, unique ids; not modified) to the end."""
        workload = fresh_workload(requests)
        c = self.config
        pools = [([Replica(i, self._engine(pool, i)) for i in range(n)],
                  make_router(policy, n, seed, {}))
                 for pool, n, policy, seed in (("prefill", c.num_prefill, c.prefill_policy, c.seed),
                                               ("decode", c.num_decode, c.decode_policy,
                                                c.seed + 1))]
        run = _DisaggregatedRun(*pools, dict(session_of or {}), self.link, self.kv_bytes_per_token)
        wall_start = time.perf_counter()
        with gc_paused():
            run.run(workload, self.kills)
            meta = {"num_prefill": c.num_prefill, "num_decode": c.num_decode,
                    "link": self.link.name,
                    "prefill_policy": c.prefill_policy, "decode_policy": c.decode_policy,
                    "seed": c.seed, "kills": list(self.kills)}
            result = run.result(workload, meta)
        result.meta["wall_seconds"] = result.merged.meta["wall_seconds"] = (
            time.perf_counter() - wall_start)
        return result


    def _engine(self, pool: str, index: int) -> Engine:
        engine = self.build[pool](index)
        if not isinstance(engine, Engine):
            raise ValueError(f"the {pool} pool's engine {index} is {engine!r}, not an Engine")
        if pool == "decode" and not engine.scheduler.takes_transferred_kv:
            raise ValueError(f"the decode pool's {engine.scheduler!r} cannot admit a request "
                             "whose KV was computed elsewhere; "
                             "use continuous batching (ContinuousBatcher)")
        return engine


class _DisaggregatedRun:
    """The two pools' event loop (see the module docstring). Before a request arrives at time t
    the prefill pool is brought up to t, so every prefill that ended before t is known; those are
    then handed to the decode pool in the order they ended."""

    def __init__(self, prefill: tuple[list[Replica], Router], decode: tuple[list[Replica], Router],
                 session_of: dict[str, str], link: KVLink, kv_bytes_per_token: float) -> None:
        # Each pool is a cluster run whose workload is what was sent to it so far.
        self.prefill = ClusterRun(*prefill, [], session_of, [], on_end=self._prefilled)
        self.decode = ClusterRun(*decode, [], session_of, [])
        self.link, self.kv_bytes_per_token = link, kv_bytes_per_token
        self.originals: dict[str, Request] = {}
        # (prefill ended, order, request id, sender)
        self.handoffs: list[tuple[float, int, str, int]] = []
        # request id -> (sender, ended, link's turn ends)
        self.sent: dict[str, tuple[int, float, float]] = {}
        self.decoding: dict[str, Request] = {}                   # the decode pool's copies
        self.lost: list[RequestRecord] = []                      # their KV died with its sender
        self.order = itertools.count()
        self.link_free = [0.0] * len(prefill[0])                 # each prefill worker's link

    def run(self, workload: Sequence[Request], kills: Sequence[tuple[float, str, int]]) -> None:
        """Arrivals and deaths in time order (a death first at a tie), then every worker to its
        end."""
        events = sorted([(t, 0, pool, i) for t, pool, i in kills]
                        + [(req.arrival_time, 1, k, req) for k, req in enumerate(workload)],
                        key=lambda e: e[:2])
        for t, kind, what, who in events:
            for rep in self.prefill.live:
                if rep.time < t:
                    rep.advance_to(t)
            self.hand_over_until(t)
            if kind == 0:
                self.kill(what, who, t)
                continue
            req = who
            self.originals[req.request_id] = req
            prefill = req.fresh_copy(max_new_tokens=1, sampling=replace(req.sampling, min_tokens=0))
            self.prefill.workload.append(prefill)
            self.prefill.route(prefill)
        for rep in self.prefill.live:
            rep.drain()
        self.prefill.hear_until(math.inf)
        self.hand_over_until(math.inf)
        for rep in self.decode.live:
            rep.drain()
        self.decode.hear_until(math.inf)

    def _prefilled(self, replica: int, req: Request, t: float) -> None:
        """A prefill ended at ``t``: it goes to the decode pool, and its KV takes the link's next
        turn."""
        if req.status is not RequestStatus.FINISHED:
            # rejected or aborted: its record is the last word
            return
        start = max(t, self.link_free[replica])
        self.link_free[replica] = start + self.transfer_time(req)
        heapq.heappush(self.handoffs, (t, next(self.order), req.request_id, replica))
        self.sent[req.request_id] = (replica, t, self.link_free[replica])

    def transfer_time(self, req: Request) -> float:
        return self.link.transfer_time(req.prompt_len * self.kv_bytes_per_token)

    def hand_over_until(self, t: float) -> None:
        """Route every request whose prefill ended by ``t`` to the decode pool, in that order."""
        while self.handoffs and self.handoffs[0][0] <= t:
            ended, _, request_id, _ = heapq.heappop(self.handoffs)
            original = self.originals[request_id]
            transfer = KVTransfer(original.prompt_len - 1, seconds=self.transfer_time(original),
                                  not_before=self.sent[request_id][2])
            decode = original.fresh_copy(kv_transfer=transfer)
            self.decoding[request_id] = decode
            self.decode.workload.append(decode)
            self.decode.route(decode, at=ended)

    def kill(self, pool: str, replica: int, t: float) -> None:
        """Worker ``replica`` of ``pool`` dies at ``t``; a prefill worker's undelivered KV dies
        with it."""
        for rep in self.decode.live:
            if rep.time < t:
                rep.advance_to(t)
        (self.prefill if pool == "prefill" else self.decode).kill(t, replica)
        if pool == "decode":
            return
        why = (f"prefill worker {replica} died at t={t:.6g} s before its KV reached a decode "
               "worker; the decode worker never received it")
        # not yet sent to the decode pool
        for handoff in [h for h in self.handoffs if h[3] == replica]:
            req = self.originals[handoff[2]]
            self.lost.append(RequestRecord(req.request_id, req.arrival_time, req.prompt_len,
                                           req.max_new_tokens,
                                           RequestStatus.ABORTED, FinishReason.ABORT, None, [], t,
                                           True, [], why))
        self.handoffs = [h for h in self.handoffs if h[3] != replica]
        heapq.heapify(self.handoffs)
        # waiting for it on a decode worker
        for request_id, req in self.decoding.items():
            landed = req.kv_transfer.arrival_time is not None and req.kv_transfer.arrival_time <= t
            if self.sent[request_id][0] == replica and not landed and not req.is_done:
                for rep in self.decode.live:
                    if request_id in rep.engine.requests:
                        rep.abort(request_id, why, t)

    def result(self, workload: Sequence[Request], meta: dict) -> DisaggregatedResult:
        prefill = build_result(self.prefill, {**meta, "pool": "prefill"})
        decode = build_result(self.decode, {**meta, "pool": "decode"})
        later = {r.request_id for r in decode.merged.requests} | {r.request_id for r in self.lost}
        records = (list(decode.merged.requests) + self.lost
                   + [r for r in prefill.merged.requests if r.request_id not in later])
        records.sort(key=lambda r: (r.arrival_time, r.request_id))
        if [r.request_id for r in records] != sorted(
                (q.request_id for q in workload),
                key=lambda rid: (self.originals[rid].arrival_time, rid)):
            raise EngineError(f"the disaggregated cluster ended with {len(records)} records for "
                              f"{len(workload)} requests: some were lost or counted twice")
        merged_meta = {**meta, "num_requests": len(records),
                       "num_rejected": sum(r.status is RequestStatus.REJECTED for r in records),
                       "num_aborted": sum(r.status is RequestStatus.ABORTED for r in records)}
        return DisaggregatedResult(prefill, decode,
                                   Trace(requests=records, steps=[], meta=merged_meta),
                                   self.transfers(), merged_meta)

    def transfers(self) -> pd.DataFrame:
        """One row per hand-off; ``kv_arrived`` (and ``transfer_start``) NaN for KV never used."""
        rows = []
        for request_id, (sender, ended, _) in self.sent.items():
            req, seconds = (self.decoding.get(request_id),
                            self.transfer_time(self.originals[request_id]))
            used = req is not None and req.first_scheduled_time is not None
            arrived = req.kv_transfer.arrival_time if used else math.nan
            rows.append((request_id, sender, ended, arrived - seconds, arrived,
                         self.originals[request_id].prompt_len * self.kv_bytes_per_token, seconds))
        return pd.DataFrame(rows,
                            columns=["request_id", "prefill_replica", "prefill_end",
                                     "transfer_start",
                                           "kv_arrived", "kv_bytes", "transfer_s"])


__all__ = ["KV_LINKS", "DisaggregatedCluster", "DisaggregatedConfig", "DisaggregatedResult",
           "KVLink", "kv_link"]
