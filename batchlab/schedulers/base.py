"""The contract every batching policy follows.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from typing import Any

from batchlab.kv_space import KVSpace
from batchlab.plan import StepPlan
from batchlab.requests import Request, RequestStatus
from batchlab.trace import PreemptionRecord

_FINISHED, _REJECTED, _ABORTED = (RequestStatus.FINISHED, RequestStatus.REJECTED,
                                  RequestStatus.ABORTED)


def split_ended(requests: list[Request]) -> tuple[list[Request], list[Request]]:
    """Split ``requests`` into (ended: finished, rejected or aborted, still running), keeping
    their order.

    Statuses are compared by identity because ``req.is_done`` (an enum ``in`` a tuple) costs
    several times more, and this runs once per request per step.
    """
    ended: list[Request] = []
    running: list[Request] = []
    for req in requests:
        status = req.status
        if status is _FINISHED or status is _REJECTED or status is _ABORTED:
            ended.append(req)
        else:
            running.append(req)
    return ended, running


class Scheduler(ABC):
    """Base class for batching policies.

    ``streams_tokens``: True when each token reaches the client as soon as it is computed; False
    for a non-streaming server that hands back each request's response when its batch ends.
    ``draining``: True once the engine has said no more requests will arrive
    (``start_draining``), so a policy that waits for a full batch may run a final partial one
    instead of waiting forever.
    """

    streams_tokens: bool = True
    takes_transferred_kv: bool = False   # admits a request whose prompt KV was computed elsewhere
    checks_drafts: bool = False          # plans speculative drafts into its decodes
    config: Any = None           # the policy's settings (a dataclass), if it has any

    def __init__(self) -> None:
        self.kv: KVSpace | None = None
        self.waiting: deque[Request] = deque()          # arrived, not admitted yet, in queue order
        self.draining: bool = False
        # a policy that preempts (paged KV) logs here
        self.preemptions: list[PreemptionRecord] = []

    def bind(self, kv: KVSpace) -> None:
        """Attach the KV space this scheduler admits against (the backend's cache); a run starts."""
        self.kv = kv
        self.draining = False

    def start_draining(self) -> None:
        """No more requests will arrive in this run (the engine calls this once)."""
        self.draining = True

    def why_unschedulable(self, req: Request) -> str | None:
        """A reason this policy could never run ``req`` (the engine rejects it), else None."""
        if self.kv is not None and not self.kv.fits_ever(req.max_total_tokens):
            return (f"needs {req.max_total_tokens} KV tokens (prompt {req.prompt_len} + "
                    f"max_new_tokens {req.max_new_tokens}); the cache holds at most "
                    f"{self.kv.capacity_tokens} and one sequence at most "
                    f"{self.kv.max_seq_len or self.kv.capacity_tokens}")
        transfer = req.kv_transfer
        if transfer is not None and not self.takes_transferred_kv:
            return (f"its KV arrives from elsewhere (kv_transfer.tokens={transfer.tokens}), and "
                    f"{type(self).__name__} computes every prompt itself "
                    "(ContinuousBatcher takes transferred KV)")
        if (transfer is not None and transfer.kv is None and self.kv is not None
                and self.kv.stores_values):
            return (f"its KV arrives from elsewhere (kv_transfer.tokens={transfer.tokens}) "
                    "without the keys and values themselves (kv_transfer.kv), "
                    "and the model's cache needs them")
        return None

    def remove_waiting(self, req: Request) -> bool:
        """Take ``req`` out of the waiting queue (an abort before admission); False if it is not
        there. (A running request that is aborted leaves at the next ``remove_ended``, like a
        finished one.)"""
        waiting = self.waiting
        for i, queued in enumerate(waiting):
            if queued is req:
                del waiting[i]
                return True
        return False

    @abstractmethod
    def add_request(self, req: Request) -> None:
        """A request has arrived (status WAITING); queue it."""

    @abstractmethod
    def schedule(self, now: float) -> StepPlan:
        """Plan the next step at time ``now``. Empty plan (with ``wake_at`` if a timer is set)
        when there is nothing to run."""

    @abstractmethod
    def remove_ended(self) -> list[Request]:
        """After a step (or an abort): remove the requests that ended from the queues, free their
        KV space, and return those whose responses are released to clients now (continuous:
        those that just finished; request-level, non-streaming: the whole batch, when it ends)."""

    @abstractmethod
    def has_pending(self) -> bool:
        """True while any request is waiting or running."""

    @abstractmethod
    def running_requests(self) -> list[Request]:
        """The requests admitted and holding KV space now (a request-level batch: all its
        members)."""
