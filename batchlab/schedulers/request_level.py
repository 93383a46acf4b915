"""What static and dynamic batching share (``RequestLevelBatcher``): a batch of whole requests
that runs until its last member ends; the two differ only in when a batch leaves the queue.

Members reserve their whole length, their prompts run in the first step, and finished members
hold their slots until the batch ends. The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from batchlab.plan import ScheduledChunk, StepPlan
from batchlab.requests import Request, RequestStatus
from batchlab.schedulers.base import Scheduler, split_ended
from batchlab.schedulers.steady import SteadyDecodes


class RequestLevelBatcher(Scheduler, SteadyDecodes):
    """Base for batchers that run whole batches of requests; see the module docstring for the rules.

    A subclass sets ``self.config`` (a dataclass with a ``stream`` field) and supplies one rule,
    ``_num_leaving(now)``: how many waiting requests leave the queue as a batch now (0 for "not
    yet"), and when to look again if nothing arrives.
    """

    config: Any

    def __init__(self) -> None:
        super().__init__()
        # The running batch: every member in admission order, and those not finished yet.
        self.batch: list[Request] = []
        self._unfinished: list[Request] = []
        self._next_batch_id = 0
        self.current_batch_id: int | None = None

    # --- the contract ------------------------------------------------------------------------
    @property
    def stream(self) -> bool:
        """True: each response is released when its request finishes; False: at batch end."""
        return self.config.stream

    @property
    def streams_tokens(self) -> bool:  # type: ignore[override]
        return self.config.stream

    def add_request(self, req: Request) -> None:
        """Queue an arrival. It waits even if a batch is running: nobody joins a running batch."""
        self.waiting.append(req)

    def has_pending(self) -> bool:
        return bool(self.waiting) or bool(self.batch)

    def running_requests(self) -> list[Request]:
        return self.batch

    def schedule(self, now: float) -> StepPlan:
        """Continue the running batch, or start the next one when the policy says it may leave."""
        if not self.batch:
            num_leaving, wake_at = self._num_leaving(now)
            if num_leaving == 0:
                return StepPlan(wake_at=wake_at)
            self._start_batch(num_leaving)
        # One chunk per unfinished member: its whole prompt in the batch's first step (nothing
        # is computed yet), then exactly the one token it sampled last step.
        chunks = []
        for req in self._unfinished:
            start = req.num_computed_tokens
            num_tokens = req.prompt_len + len(req.output_ids) - start
            chunks.append(ScheduledChunk(req.request_id, start, num_tokens, True))
        return StepPlan(chunks=chunks, held_slots=len(self.batch) - len(self._unfinished),
                        batch_id=self.current_batch_id)

    def remove_ended(self) -> list[Request]:
        """Note which members ended; when the last one has, free the batch's KV and end it.

        Returns the members finishing now when streaming, else the whole batch at its end.
        """
        if not self.batch:
            return []
        just_finished, still_running = split_ended(self._unfinished)
        if just_finished:
            self._unfinished = still_running
        released = just_finished if self.stream else []
        if not self._unfinished:
            for req in self.batch:
                self.kv.free(req.request_id)
            if not self.stream:
                released = self.batch
            self.batch = []
            self.current_batch_id = None
        return released

    # --- what the fast path asks: a batch's members decode together until one finishes ----------
    def decodes_steadily(self, request_ids: tuple[str, ...], held_slots: int,
                         batch_id: int | None) -> bool:
        unfinished = self._unfinished
        return (bool(unfinished) and batch_id == self.current_batch_id
                and len(request_ids) == len(unfinished))

    def decode_steps_with_room(self, request_ids: tuple[str, ...], wanted: int) -> int:
        return wanted          # each member's whole length was reserved when the batch started

    def grow_for_decode_steps(self, request_ids: tuple[str, ...], num_steps: int) -> None:
        pass

    @property
    def unfinished(self) -> list[Request]:
        """The running batch's members that have not finished yet, in admission order."""
        return self._unfinished

    # --- the policy's one rule -----------------------------------------------------------------
    @abstractmethod
    def _num_leaving(self, now: float) -> tuple[int, float | None]:
        """With no batch running: how many waiting requests leave as a batch at ``now`` (0 = none
        yet), and the time at which that may change without a new arrival (or None)."""

    # --- helpers -----------------------------------------------------------------------------
    def _start_batch(self, num_leaving: int) -> None:
        """Admit up to ``num_leaving`` requests from the front of the queue, as many as the KV
        fits."""
        if self.kv is None:
            raise RuntimeError(f"{type(self).__name__} has no KV space; "
                               "call bind(kv) before schedule()")
        members: list[Request] = []
        while self.waiting and len(members) < num_leaving:
            req = self.waiting[0]
            if not self.kv.can_admit(req.max_total_tokens, req.max_total_tokens):
                break  # the rest wait for the next batch, in arrival order
            self.waiting.popleft()
            self.kv.admit(req.request_id, req.max_total_tokens, req.max_total_tokens)
            req.status = RequestStatus.RUNNING
            members.append(req)
        if not members:
            head = self.waiting[0]
            raise RuntimeError(
                f"request {head.request_id!r} needs {head.max_total_tokens} KV tokens but only "
                f"{self.kv.capacity_tokens - self.kv.used_tokens} of {self.kv.capacity_tokens} are "
                "free between batches; something other than this scheduler holds KV space")
        self.batch = members
        self._unfinished = list(members)
        self.current_batch_id = self._next_batch_id
        self._next_batch_id += 1
