"""Continuous batching (``ContinuousBatcher``): the batch is re-formed at every step, within a
token budget, in vLLM V1's order: decodes, unfinished prompts, then waiting requests.

On a paged cache a request that cannot grow preempts the most recently admitted one (recomputed
later). Transferred prompt KV counts as computed at first admission; a draft rides along with
its request's decode. The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from batchlab.checks import check_bool, check_int
from batchlab.engine_args import EngineArgs
from batchlab.plan import ScheduledChunk, StepPlan
from batchlab.requests import KVTransfer, Request, RequestStatus
from batchlab.schedulers.base import Scheduler, split_ended
from batchlab.schedulers.steady import SteadyDecodes, reuses_unheld_blocks
from batchlab.trace import PreemptionRecord


def _transfer(req: Request) -> KVTransfer | None:
    """The prompt KV that ``req`` brings and has not used yet (once used, a preemption loses it)."""
    return req.kv_transfer if req.first_scheduled_time is None else None


def _kv_in_flight(req: Request, now: float) -> bool:
    """Admitted, holding blocks for KV that has not landed yet (computes nothing until then)."""
    transfer = _transfer(req)
    return transfer is not None and transfer.in_flight(now)


def _admit(kv, req: Request, num_tokens: int, now: float) -> ScheduledChunk | None:
    """Give ``req`` its KV room and a seat: its first chunk, or None while its transferred KV is in
    flight (the pull starts now, into the blocks it holds from now on)."""
    ready = ready_tokens(kv, req)      # a cached prefix, or transferred KV, is not computed again
    transfer = _transfer(req)
    if transfer is not None:
        transfer.start(now)
    in_flight = _kv_in_flight(req, now)
    held = ready if in_flight else ready + num_tokens
    start = max(kv.admit(req.request_id, held, req.max_total_tokens, req.prompt_ids), ready)
    # the keys and values themselves: into the cache
    if transfer is not None and transfer.kv is not None:
        if kv.stores_values:
            kv.write_tokens(req.request_id, transfer.kv[:, :transfer.tokens])
        transfer.kv = None
    req.num_computed_tokens, req.status = start, RequestStatus.RUNNING
    return None if in_flight else ScheduledChunk(req.request_id, start, num_tokens,
                                                 start + num_tokens == req.num_known_tokens)


def _plan_drafts(kv, drafted: list[tuple[int, Request]], step: "_StepBudget") -> None:
    """1b. Speculative decoding: each decode (in order; ``drafted`` holds its place in the step)
    takes its request's draft along, as far as the budget left, its KV room and its
    ``max_new_tokens`` allow (a check emits its accepted drafts and one more). A draft that finds
    no room is dropped, never a reason to preempt. (vLLM v1: a running request is scheduled with
    its draft tokens.)"""
    for i, req in drafted:
        draft = req.spec.draft_ids
        n = min(len(draft), step.budget, req.max_new_tokens - len(req.output_ids) - 1)
        if n > 0 and req.status is RequestStatus.RUNNING and kv.grow(req.request_id, n):
            c = step.chunks[i]
            step.chunks[i] = ScheduledChunk(c.request_id, c.start, 1 + n, True, tuple(draft[:n]))
            step.budget -= n


def ready_tokens(kv, req: Request) -> int:
    """Tokens a waiting ``req`` need not compute: a prefix cached in ``kv``, or the prompt KV
    transferred to it (on its first admission only)."""
    cached = kv.cached_prefix_tokens(req.prompt_ids, req.num_known_tokens - 1)
    transfer = _transfer(req)
    return cached if transfer is None else max(cached, transfer.tokens)


@dataclass(frozen=True)
class ContinuousBatcherConfig:
    """The budgets of one step.

    ``max_num_seqs``: the most requests running at once (vLLM's ``--max-num-seqs``; each holds
    KV space, which is a separate limit: the KV space's own size).
    ``max_num_batched_tokens``: the most tokens computed in one step, prompt chunks and decodes
    together.
    ``chunked_prefill``: split a prompt across steps when it does not fit the step's remaining
    budget.
    ``long_prefill_token_threshold``: if set, no request gets more than this many prompt tokens in
    one step, so several long prompts share a step instead of one taking the whole budget
    (needs ``chunked_prefill``). The defaults of the first two are vLLM's usual ones.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    chunked_prefill: bool = True
    long_prefill_token_threshold: int | None = None

    def __post_init__(self) -> None:
        check_int("max_num_seqs", self.max_num_seqs)
        check_int("max_num_batched_tokens", self.max_num_batched_tokens,
                  hint="a step must be able to compute at least one token")
        check_bool("chunked_prefill", self.chunked_prefill)
        threshold = self.long_prefill_token_threshold
        check_int("long_prefill_token_threshold", threshold, allow_none=True, hint="None: no cap")
        if threshold is not None:
            if not self.chunked_prefill:
                raise ValueError(f"long_prefill_token_threshold={threshold} needs "
                                 "chunked_prefill=True: capping a prompt's tokens per step means "
                                 "splitting the prompt")


def _first_chunk(config: ContinuousBatcherConfig, kv, req: Request, budget: int) -> int:
    """How many tokens a waiting ``req`` would compute if admitted now with ``budget`` tokens
    left in the step; 0 if it cannot start now (no budget, or no KV room). Its tokens are its
    prompt, plus the tokens it generated before a preemption, less a cached prefix."""
    if budget <= 0:
        return 0
    cached = ready_tokens(kv, req)
    rest = req.num_known_tokens - cached
    if not config.chunked_prefill:
        num_tokens = rest if rest <= budget else 0
    else:
        num_tokens = min(rest, budget, config.long_prefill_token_threshold or budget)
    if num_tokens and not kv.can_admit(cached + num_tokens, req.max_total_tokens, req.prompt_ids):
        return 0
    return num_tokens


class ContinuousBatcher(Scheduler, SteadyDecodes):
    """Plan every step from a token budget, letting requests join and leave at any step.

    Rules for one step (budget = ``max_num_batched_tokens`` tokens):

    1. **Decodes first.** Every running request that has finished its prompt gets exactly one
       token (the one it sampled last step). This always fits: a request is admitted only when
       every running request has been served and budget is left over, so there are never more
       running requests than ``max_num_batched_tokens``.
    2. **Unfinished prompts next.** A running request still in its prompt (chunked prefill, or
       recomputing after a preemption) continues with ``min(rest of its prompt, remaining
       budget)`` tokens, capped by ``long_prefill_token_threshold`` if set. They are served in
       admission order, so an earlier long prompt may use up the budget and a later one waits a
       step (the cap prevents that).
    3. **Then waiting requests, first come first served.** The request at the head of the queue
       is admitted while fewer than ``max_num_seqs`` requests run, the budget has room, and the
       KV space can admit it (``first_chunk_tokens``). Its first chunk is ``min(prompt, remaining
       budget)`` tokens with chunked prefill (less any cached prefix); without it, the whole
       prompt, and only if the whole prompt fits the remaining budget.
    4. **No overtaking.** When the head of the queue cannot be admitted, admission stops for this
       step: service keeps arrival order and the head starts as soon as room appears.
    5. **Leaving.** A request leaves after the step that produced its last token: its response is
       released then (tokens stream as computed) and its KV space is freed for the next step.
    6. **Growth and preemption.** Each planned chunk first grows its request's KV room. When that
       fails (a paged space out of blocks), the most recently admitted running request that is
       not yet planned in this step is preempted (possibly the request itself): blocks freed,
       back to the front of the queue, recomputed from its cached prefix (or from 0) when
       admitted again. A prompt in progress that cannot grow without undoing a chunk already
       planned waits a step. No request is admitted in a step with a preemption.

    A request is planned at most once a step; a decode is one token, plus its draft under
    speculative decoding (``_plan_drafts``: from the budget the decodes leave, before prompts).
    """

    takes_transferred_kv = True
    checks_drafts = True

    def __init__(self, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048,
                 chunked_prefill: bool = True,
                 long_prefill_token_threshold: int | None = None) -> None:
        super().__init__()
        self.config = ContinuousBatcherConfig(max_num_seqs, max_num_batched_tokens, chunked_prefill,
                                              long_prefill_token_threshold)
        self.running: list[Request] = []   # in admission order

    # --- the contract ------------------------------------------------------------------------
    def why_unschedulable(self, req: Request) -> str | None:
        """Besides the KV check: without chunked prefill a prompt must fit one step's budget."""
        reason = super().why_unschedulable(req)
        if (reason is None and not self.config.chunked_prefill
                and req.prompt_len > self.config.max_num_batched_tokens):
            reason = (f"prompt of {req.prompt_len} tokens exceeds max_num_batched_tokens="
                      f"{self.config.max_num_batched_tokens}, and chunked_prefill=False means a "
                      "prompt must be computed in one step")
        return reason

    def add_request(self, req: Request) -> None:
        self.waiting.append(req)

    def has_pending(self) -> bool:
        return bool(self.waiting) or bool(self.running)

    def running_requests(self) -> list[Request]:
        return self.running

    def schedule(self, now: float) -> StepPlan:
        """Plan one step: decodes, then unfinished prompts, then new requests (class rules)."""
        if self.kv is None:
            raise RuntimeError("ContinuousBatcher has no KV space; call bind(kv) before schedule()")
        step = _StepBudget(self.config.max_num_batched_tokens)
        num_preempted = len(self.preemptions)
        in_prompt = self._plan_decodes(step, now)
        self._plan_prompts([r for r in in_prompt if not _kv_in_flight(r, now)], step, now)
        if len(self.preemptions) == num_preempted:   # memory ran out: admit nobody (as vLLM v1)
            self._admit_waiting(step, now)
        if step.chunks:
            return StepPlan(chunks=step.chunks)
        landing = [r.kv_transfer.arrival_time for r in self.running if _kv_in_flight(r, now)]
        return StepPlan(wake_at=min(landing, default=None))     # nothing to compute until KV lands

    def _plan_decodes(self, step: "_StepBudget", now: float) -> list[Request]:
        """1. One token for each running request past its prompt, in admission order; returns the
        requests still in their prompt (or recomputing after a preemption)."""
        in_prompt: list[Request] = []
        decoding: list[Request] = []
        for req in self.running:
            computed = req.num_computed_tokens
            if computed < req.prompt_len or computed + 1 < req.prompt_len + len(req.output_ids):
                in_prompt.append(req)
            else:
                decoding.append(req)
        # Room for one more token each; from the first without room on, ``_make_room`` preempts.
        grown, chunks = self.kv.grow_each([r.request_id for r in decoding]), step.chunks
        drafted = []
        for i, req in enumerate(decoding):
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            if i >= grown and not self._make_room(req, 1, chunks, now):
                break     # it preempted itself: everyone after it is preempted too
            # its one uncomputed token, sampled last step (step.add written out: a hot loop)
            if req.spec is not None and req.spec.draft_ids:
                drafted.append((len(chunks), req))
            chunks.append(ScheduledChunk(req.request_id, req.num_computed_tokens, 1, True))
        step.budget -= len(chunks)
        if drafted:
            _plan_drafts(self.kv, drafted, step)
        return in_prompt

    def _plan_prompts(self, in_prompt: list[Request], step: "_StepBudget", now: float) -> None:
        """2. Continue the prompts already started, as far as the budget goes."""
        cap = self.config.long_prefill_token_threshold or step.budget
        for req in in_prompt:
            if step.budget == 0:
                break
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted in this step
            start = req.num_computed_tokens
            rest = req.num_known_tokens - start
            num_tokens = min(rest, step.budget, cap) if self.config.chunked_prefill else rest
            if num_tokens > step.budget:
                continue  # only without chunked prefill: the whole rest must fit
            if self._make_room(req, num_tokens, step.chunks, now):
                step.add(ScheduledChunk(req.request_id, start, num_tokens,
                                             start + num_tokens == req.num_known_tokens))

    def _admit_waiting(self, step: "_StepBudget", now: float) -> None:
        """3. Admit waiting requests, first come first served, up to one that cannot start."""
        waiting = self.waiting
        while waiting and len(self.running) < self.config.max_num_seqs:
            req = waiting[0]
            num_tokens = self.first_chunk_tokens(req, step.budget)
            if num_tokens == 0:
                break
            waiting.popleft()
            chunk = _admit(self.kv, req, num_tokens, now)
            self.running.append(req)
            if chunk is not None:
                step.add(chunk)

    def first_chunk_tokens(self, req: Request, budget: int) -> int:
        """Tokens a waiting ``req`` would compute, admitted now with ``budget`` left; 0: not now."""
        return _first_chunk(self.config, self.kv, req, budget)

    def _make_room(self, req: Request, num_tokens: int, planned: list[ScheduledChunk],
                   now: float) -> bool:
        """Grow ``req`` by ``num_tokens``, preempting the most recently admitted running requests
        while it cannot. False if that would undo a chunk already planned in this step, or if
        ``req`` itself had to be preempted."""
        kv = self.kv
        while not kv.grow(req.request_id, num_tokens):
            victim = self.running[-1]
            if any(c.request_id == victim.request_id for c in planned):   # (rare: a scan is fine)
                return False
            self._preempt(victim, now)
            if victim is req:
                return False
        return True

    def _preempt(self, req: Request, now: float) -> None:
        """Free ``req``'s KV and put it back at the front of the queue, to be recomputed."""
        self.running.remove(req)
        self.kv.free(req.request_id)
        self.preemptions.append(PreemptionRecord(req.request_id, now, req.num_computed_tokens,
                                                 len(req.output_ids)))
        req.status = RequestStatus.WAITING
        req.num_computed_tokens = 0
        if _transfer(req) is not None:
            req.kv_transfer.arrival_time = None   # in flight: pulled again (used: recomputed)
        if req.spec is not None:
            req.spec.draft_ids = []                # drafted anew once it samples again
        self.waiting.appendleft(req)

    def remove_ended(self) -> list[Request]:
        """Remove the requests that ended (finished or aborted), free their KV, and release them."""
        ended, still_running = split_ended(self.running)
        if ended:
            self.running = still_running
            for req in ended:
                self.kv.free(req.request_id)
        return ended

    def decodes_steadily(self, request_ids: tuple[str, ...], held_slots: int,
                         batch_id: int | None) -> bool:
        """Yes when that step held every running request in running order (so each decodes next,
        in the order ``schedule`` lists them) and the head of the queue cannot be admitted (no
        seat, budget or KV room; none of that changes before a request arrives or finishes), nor
        reuse cached blocks that nobody holds (the run's new blocks could evict them)."""
        running, waiting, config = self.running, self.waiting, self.config
        if (len(request_ids) != len(running)
                or request_ids != tuple([r.request_id for r in running])):
            return False
        if not waiting or len(running) >= config.max_num_seqs:
            return True
        head = waiting[0]
        if self.first_chunk_tokens(head, config.max_num_batched_tokens - len(running)):
            return False
        return not reuses_unheld_blocks(self.kv, head.prompt_ids, head.num_known_tokens - 1)

    def __repr__(self) -> str:
        return f"ContinuousBatcher({', '.join(f'{k}={v}' for k, v in asdict(self.config).items())})"


def batcher_for(args: EngineArgs,
                kind: type[ContinuousBatcher] = ContinuousBatcher) -> ContinuousBatcher:
    """The scheduler vLLM's flags ``args`` describe (their budgets set, as the caller resolved
    them); ``kind``: ``ContinuousBatcher`` or a variant of it."""
    return kind(args.max_num_seqs, args.max_num_batched_tokens, args.enable_chunked_prefill,
                args.long_prefill_token_threshold)


class _StepBudget:
    """One step being planned: its chunks and the token budget left."""

    __slots__ = ("budget", "chunks")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.chunks: list[ScheduledChunk] = []

    def add(self, chunk: ScheduledChunk) -> None:
        self.chunks.append(chunk)
        self.budget -= chunk.num_tokens
