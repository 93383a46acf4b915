"""The cluster driver: N engines on one virtual clock behind a router, stepped in time order.

The rules and their reasons: ``docs/replicas-and-router.md``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Mapping, Sequence

from batchlab.cluster.reports import LiveReports, stored_blocks
from batchlab.cluster.replica import Replica
from batchlab.cluster.router import RouteRequest, Router
from batchlab.listener import EngineListener, StepOutput
from batchlab.requests import FinishReason, Request, RequestStatus
from batchlab.trace import RequestRecord

END, FIRST_TOKEN = 0, 1


class RouterFeed(EngineListener):
    """Queues each request's end on a replica, with its time, for the router to read in order;
    ``also(replica, req, t)``, if given, hears each end as it happens (a disaggregated cluster
    hands a finished prefill on)."""

    def __init__(self, replica: int, queue: list, counter: itertools.count,
                 also: Callable[[int, Request, float], None] | None = None) -> None:
        self.replica, self.queue, self.counter, self.also = replica, queue, counter, also

    def on_end(self, req: Request, t: float) -> None:
        heapq.heappush(self.queue, (t, next(self.counter), END, self.replica, req.request_id))
        if self.also is not None:
            self.also(self.replica, req, t)


class RouterFeedWithFirstTokens(RouterFeed):
    """Also queues each request's first token (for routers that track prefill work)."""

    def on_step(self, out: StepOutput) -> None:
        for o in out.outputs:
            if o.new_token_ids and len(o.req.output_ids) == len(o.new_token_ids):
                heapq.heappush(self.queue,
                               (out.step.end, next(self.counter), FIRST_TOKEN, self.replica,
                                o.request_id))


class RoutingLog:
    """One row per routed request, kept as columns (a large run routes 10^5 requests)."""

    COLUMNS = ("request_id", "session", "replica", "decision", "routed_at", "predicted_hit_tokens",
               "cached_at_route_tokens")

    def __init__(self) -> None:
        self.columns: dict[str, list] = {name: [] for name in self.COLUMNS}

    def add(self, *values) -> None:
        for name, value in zip(self.COLUMNS, values):
            self.columns[name].append(value)


class ClusterRun:
    """One run of replicas and a router over a workload (fresh requests, sorted by arrival)."""

    def __init__(self, replicas: Sequence[Replica], router: Router, workload: Sequence[Request],
                 session_of: Mapping[str, str], kills: Sequence[tuple[float, int]],
                 on_end: Callable[[int, Request, float], None] | None = None) -> None:
        self.replicas, self.router, self.workload = list(replicas), router, workload
        self.session_of, self.kills = session_of, sorted(kills)
        self.live = list(self.replicas)
        self.reports = LiveReports(self.replicas)
        self.notices: list = []
        self.log = RoutingLog()
        self.rejected: list[RequestRecord] = []
        feed = RouterFeedWithFirstTokens if router.needs_first_tokens else RouterFeed
        counter = itertools.count()
        for rep in self.replicas:
            rep.start(feed(rep.index, self.notices, counter, on_end))

    def run(self) -> None:
        """Every event in time order, then every replica to its end."""
        interval = self.router.metrics_interval_s
        num_scrapes, kill_i, i = 0, 0, 0
        while i < len(self.workload):
            t_arrival = self.workload[i].arrival_time
            t_kill = self.kills[kill_i][0] if kill_i < len(self.kills) else math.inf
            t_scrape = num_scrapes * interval if interval else math.inf
            if t_kill <= t_arrival and t_kill <= t_scrape:
                self.kill(*self.kills[kill_i])
                kill_i += 1
            elif t_scrape <= t_arrival:
                self.reports.scrape(t_scrape)
                num_scrapes += 1
            else:
                self.route(self.workload[i])
                i += 1
        for t, replica in self.kills[kill_i:]:
            self.kill(t, replica)
        for rep in self.live:
            rep.drain()
        self.hear_until(math.inf)

    def hear_until(self, t: float) -> None:
        """Tell the router of every end (and first token) that happened by ``t``, in time order."""
        notices, router = self.notices, self.router
        while notices and notices[0][0] <= t:
            when, _, kind, replica, request_id = heapq.heappop(notices)
            if kind == END:
                router.request_ended(request_id, replica, when)
            else:
                router.first_token(request_id, replica, when)

    def route(self, req: Request, at: float | None = None) -> None:
        """``req`` arrives (at ``at``, by default its arrival time): bring everyone up to now, let
        the router choose, hand it over."""
        t = req.arrival_time if at is None else at
        for rep in self.live:
            if rep.time < t:
                rep.advance_to(t)
        self.hear_until(t)
        if not self.router.alive:
            self.reject(req, "no replica is alive to serve it (every replica has died)")
            return
        self.reports.now = t
        view = RouteRequest(req.request_id, req.prompt_ids, req.prompt_len,
                            self.session_of.get(req.request_id), t)
        decision = self.router.route(view, self.reports)
        rep = self.replicas[decision.replica]
        rep.sync()
        self.log.add(req.request_id, view.session, decision.replica, decision.reason, t,
                     decision.predicted_hit_tokens, self.reusable_tokens(rep, view))
        rep.add(req, t)

    def reusable_tokens(self, rep: Replica, view: RouteRequest) -> int:
        """Prompt tokens the replica's cache holds for ``view`` now (what admission could reuse)."""
        block_size = rep.engine.backend.kv.block_size
        if block_size is None or view.prompt_ids is None:
            return 0
        hashes = view.hashes(block_size)
        return stored_blocks(rep.engine.backend.kv, hashes,
                             (view.prompt_len - 1) // block_size) * block_size

    def reject(self, req: Request, why: str) -> None:
        """The cluster itself turns ``req`` away (no replica to send it to); it stays in the
        result."""
        self.rejected.append(RequestRecord(req.request_id, req.arrival_time, req.prompt_len,
                                           req.max_new_tokens,
                                           RequestStatus.REJECTED, FinishReason.REJECTED, None, [],
                                           req.arrival_time, True, [], why))

    def kill(self, t: float, replica: int) -> None:
        """Replica ``replica`` dies at ``t`` (see ``Replica.kill``); the router stops using it."""
        rep = self.replicas[replica]
        if not rep.alive:
            return
        rep.kill(t)
        self.live.remove(rep)
        self.router.replica_died(replica)


__all__ = ["ClusterRun", "RouterFeed", "RouterFeedWithFirstTokens", "RoutingLog"]
