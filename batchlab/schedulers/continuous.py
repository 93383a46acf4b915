"""Continuous batching: the batch is re-formed at every step, within a token budget.

Continuous (iteration-level) batching, introduced by Orca and used by vLLM, does not wait for a
batch to end. Every step it asks each request "how many of your tokens are computed, and how many
do you need?" and hands out tokens from a per-step budget until requests catch up. A request that
finishes leaves after the step that produced its last token, and a waiting one may take its place
at the very next step. With chunked prefill, a long prompt is split across several steps so it
never stalls the decoding requests beside it for long.

The order of one step follows vLLM's v1 scheduler:

1. running requests that are decoding, one token each;
2. running requests still in their prompt, continuing it with what is left of the budget;
3. waiting requests, first come first served, while there is room.

Memory decides how many can run. With a reserving KV space (the slot cache, or the simulator's
``TokenKVSpace``) a request is admitted only when its whole possible length fits, and nobody is
ever preempted. With a paged one (``kv.grows_on_demand``: ``kv_blocks.BlockManager``) a request
is admitted with blocks for its first step, grows a block at a time, and when a running request
needs a block and none is free the most recently admitted running request is **preempted**
(vLLM v1's rule): its blocks are freed, it goes back to the front of the waiting queue, and when
it is admitted again its prompt and the tokens it already generated are computed again (its
output so far is kept). Each preemption is recorded in ``preemptions``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from batchlab.checks import check_bool, check_int
from batchlab.plan import ScheduledChunk, StepPlan
from batchlab.requests import Request, RequestStatus
from batchlab.schedulers.base import Scheduler, split_ended
from batchlab.trace import PreemptionRecord


@dataclass(frozen=True)
class ContinuousBatcherConfig:
    """The budgets of one step.

    ``max_num_seqs``: the most requests running at once (each holds KV space).
    ``max_num_batched_tokens``: the most tokens computed in one step, prompt chunks and decodes together.
    ``chunked_prefill``: split a prompt across steps when it does not fit the step's remaining budget.
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
                raise ValueError(f"long_prefill_token_threshold={threshold} needs chunked_prefill=True: "
                                 "capping a prompt's tokens per step means splitting the prompt")


class ContinuousBatcher(Scheduler):
    """Plan every step from a token budget, letting requests join and leave at any step.

    Rules for one step (budget = ``max_num_batched_tokens`` tokens):

    1. **Decodes first.** Every running request that has finished its prompt gets exactly one
       token (the one it sampled last step). This always fits: a request is admitted only when
       every running request has been served and budget is left over, so there are never more
       running requests than ``max_num_batched_tokens``.
    2. **Unfinished prompts next.** A running request still in its prompt (chunked prefill)
       continues with ``min(rest of its prompt, remaining budget)`` tokens, capped by
       ``long_prefill_token_threshold`` if set. They are served in admission order, so an
       earlier long prompt may use up the budget and a later one waits a step (the cap prevents
       that).
    3. **Then waiting requests, first come first served.** The request at the head of the queue
       is admitted while fewer than ``max_num_seqs`` requests run, the budget has room, and the
       KV cache can reserve its prompt plus all its possible output
       (``kv.can_allocate(prompt_len + max_new_tokens)``). Its first chunk is
       ``min(prompt, remaining budget)`` tokens with chunked prefill; without it, the whole
       prompt, and only if the whole prompt fits the remaining budget.
    4. **No overtaking.** When the head of the queue cannot be admitted (no KV room, or its prompt
       does not fit the remaining budget without chunked prefill), admission stops for this step:
       later, smaller requests do not jump ahead of it. This keeps service in arrival order and
       guarantees the head is admitted as soon as room appears, at the cost of some idle room.
    5. **Leaving.** A request leaves after the step that produced its last token: its response is
       released then (tokens stream as they are computed) and its KV space is freed, so a waiting
       request can use it at the very next step.
    6. **Preemption (paged KV only).** With a reserving KV space, space is reserved in full at
       admission, so a running request never runs out of cache; when the cache is full, new
       requests simply wait. With a paged space (``kv.grows_on_demand``), admission needs blocks
       for the first chunk only (less any cached prefix blocks), and each planned chunk first
       grows its request's blocks. When a request cannot grow, the most recently admitted
       running request that is not yet planned in this step is preempted (possibly the request
       itself): blocks freed, back to the front of the queue, recomputed from its cached prefix
       (or from 0) when admitted again. A prompt in progress that cannot grow without undoing a
       chunk already planned waits a step. No request is admitted in a step with a preemption.

    A request is never planned twice in one step, and a decode is always exactly one token.
    """

    streams_tokens = True

    def __init__(self, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048,
                 chunked_prefill: bool = True, long_prefill_token_threshold: int | None = None) -> None:
        super().__init__()
        self.config = ContinuousBatcherConfig(max_num_seqs, max_num_batched_tokens, chunked_prefill,
                                              long_prefill_token_threshold)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []   # in admission order
        # Did the last plan list every running request, in running order? (continues_decoding)
        self._plan_in_running_order = False

    # --- config, read-only ---------------------------------------------------------------------
    @property
    def max_num_seqs(self) -> int:
        return self.config.max_num_seqs

    @property
    def max_num_batched_tokens(self) -> int:
        return self.config.max_num_batched_tokens

    @property
    def chunked_prefill(self) -> bool:
        return self.config.chunked_prefill

    @property
    def long_prefill_token_threshold(self) -> int | None:
        return self.config.long_prefill_token_threshold

    # --- the contract ------------------------------------------------------------------------
    def why_unschedulable(self, req: Request) -> str | None:
        """Besides the KV check: without chunked prefill a prompt must fit one step's budget."""
        reason = super().why_unschedulable(req)
        if reason is None and not self.config.chunked_prefill and req.prompt_len > self.config.max_num_batched_tokens:
            reason = (f"prompt of {req.prompt_len} tokens exceeds max_num_batched_tokens="
                      f"{self.config.max_num_batched_tokens}, and chunked_prefill=False means a prompt "
                      "must be computed in one step")
        return reason

    def add_request(self, req: Request) -> None:
        self.waiting.append(req)

    def has_pending(self) -> bool:
        return bool(self.waiting) or bool(self.running)

    def schedule(self, now: float) -> StepPlan:
        """Plan one step: decodes, then unfinished prompts, then new requests (see the class rules)."""
        kv = self.kv
        if kv is None:
            raise RuntimeError("ContinuousBatcher has no KV space; call bind(kv) before schedule()")
        config = self.config
        budget = config.max_num_batched_tokens
        chunked = config.chunked_prefill
        # Per-request cap on prompt tokens in one step (the budget itself when there is no cap).
        prefill_cap = config.long_prefill_token_threshold or budget
        chunks: list[ScheduledChunk] = []

        # Paged KV: requests planned in this step (never preempted), and whether anyone was.
        paged = kv.grows_on_demand
        planned: set[str] = set()
        num_preempted = len(self.preemptions)

        # 1. Decodes: one token each, in admission order. Prompts in progress (and requests
        # recomputing after a preemption) are set aside.
        in_prompt: list[Request] = []
        for req in list(self.running) if paged else self.running:
            if paged and req.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            computed = req.num_computed_tokens
            # (The second test only matters after a preemption; skipped otherwise: this loop is hot.)
            if computed < req.prompt_len or (paged and computed + 1 < req.num_known_tokens):
                in_prompt.append(req)
                continue
            if paged:
                if not self._make_room(req, 1, planned, now):
                    break     # it preempted itself: everyone after it is preempted too
                planned.add(req.request_id)
            # The token it sampled last step is its one uncomputed token. (The engine checks that
            # every chunk continues its cache and samples at the last known token.)
            chunks.append(ScheduledChunk(req.request_id, computed, 1, True))
            budget -= 1
        # Were all prompts in progress at the end of the running list? (Then the plan lists the
        # running requests in their own order; see ``continues_decoding``.)
        prompts_last = not in_prompt or (
            not paged and in_prompt[0] is self.running[len(self.running) - len(in_prompt)])

        # 2. Prompts already started (only with chunked prefill): continue them.
        for req in in_prompt:
            if budget == 0:
                break
            if req.status is not RequestStatus.RUNNING:
                continue  # paged KV: preempted in this step
            start = req.num_computed_tokens
            rest = req.num_known_tokens - start
            num_tokens = min(rest, budget, prefill_cap) if chunked else rest
            if num_tokens > budget:
                continue  # only without chunked prefill: the whole rest must fit
            if paged:
                if not self._make_room(req, num_tokens, planned, now):
                    continue  # no room without undoing planned work (or it was preempted)
                planned.add(req.request_id)
            chunks.append(ScheduledChunk(req.request_id, start, num_tokens,
                                         start + num_tokens == req.num_known_tokens))
            budget -= num_tokens

        # 3. Waiting requests, first come first served; stop at the first that cannot start.
        waiting = self.waiting
        if paged and len(self.preemptions) > num_preempted:
            waiting = ()   # memory ran out in this step: admit nobody (vLLM v1 does the same)
        while waiting and len(self.running) < config.max_num_seqs:
            req = waiting[0]
            num_tokens = self._first_chunk_tokens(req, budget)
            if num_tokens == 0:
                break
            waiting.popleft()
            start = 0
            if paged:  # blocks for the first chunk only; a cached prefix is not computed again
                start = kv.cached_prefix_tokens(req.prompt_ids, req.num_known_tokens - 1)
                kv.allocate(req.request_id, start + num_tokens, req.prompt_ids)
                req.num_computed_tokens = start
            else:
                kv.allocate(req.request_id, req.max_total_tokens)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            chunks.append(ScheduledChunk(req.request_id, start, num_tokens,
                                         start + num_tokens == req.num_known_tokens))
            budget -= num_tokens

        self._plan_in_running_order = prompts_last and len(chunks) == len(self.running)
        return StepPlan(chunks=chunks)

    def _first_chunk_tokens(self, req: Request, budget: int) -> int:
        """How many tokens a waiting ``req`` would compute if admitted now with ``budget`` tokens
        left in the step; 0 if it cannot start now (no budget, or no KV room). Its tokens are its
        prompt, plus the tokens it generated before a preemption, less a cached prefix."""
        kv = self.kv
        if budget <= 0:
            return 0
        if not kv.grows_on_demand:
            if not kv.can_allocate(req.max_total_tokens):
                return 0
            cached = 0
        else:
            cached = kv.cached_prefix_tokens(req.prompt_ids, req.num_known_tokens - 1)
        rest = req.num_known_tokens - cached
        config = self.config
        if not config.chunked_prefill:
            num_tokens = rest if rest <= budget else 0
        else:
            num_tokens = min(rest, budget, config.long_prefill_token_threshold or budget)
        if kv.grows_on_demand and num_tokens and not kv.can_allocate(cached + num_tokens, req.prompt_ids):
            return 0
        return num_tokens

    def _make_room(self, req: Request, num_tokens: int, planned: set[str], now: float) -> bool:
        """Paged KV: grow ``req`` by ``num_tokens``, preempting the most recently admitted running
        requests while it cannot. False if that would undo a chunk already planned in this step,
        or if ``req`` itself had to be preempted."""
        kv = self.kv
        while not kv.can_grow(req.request_id, num_tokens):
            victim = self.running[-1]
            if victim.request_id in planned:
                return False
            self._preempt(victim, now)
            if victim is req:
                return False
        kv.grow(req.request_id, num_tokens)
        return True

    def _preempt(self, req: Request, now: float) -> None:
        """Free ``req``'s blocks and put it back at the front of the queue, to be recomputed."""
        self.running.remove(req)
        self.kv.free(req.request_id)
        self.preemptions.append(PreemptionRecord(req.request_id, now, req.num_computed_tokens,
                                                 len(req.output_ids)))
        req.status = RequestStatus.WAITING
        req.num_computed_tokens = 0
        self.waiting.appendleft(req)

    may_continue_decoding = True

    def continues_decoding(self, plan: StepPlan) -> bool:
        """True when the next steps are pure decodes of ``plan``'s requests until someone arrives
        or finishes, so the simulator may compute them without asking (see ``Scheduler``).

        The engine asks after a step in which every chunk sampled and nobody finished. Then the
        answer is yes when (a) that plan held every running request, in running order (so now
        each of them decodes, in the order ``schedule`` would list them), and (b) the head of the
        queue cannot be admitted: the running list is full, the decodes use the whole budget, or
        the head does not fit (KV or budget). Neither can change before a request arrives or
        finishes: no KV space is freed and the number of decodes stays the same.
        """
        running = self.running
        if self.kv is not None and self.kv.grows_on_demand:
            return False   # paged KV: a decode may need a new block, or a preemption, any step
        if not (running and self._plan_in_running_order and len(plan.chunks) == len(running)):
            return False
        waiting = self.waiting
        if not waiting or len(running) >= self.config.max_num_seqs:
            return True
        return self._first_chunk_tokens(waiting[0], self.config.max_num_batched_tokens - len(running)) == 0

    def on_step_end(self, plan: StepPlan, now: float) -> list[Request]:
        """Remove the requests that finished in this step, free their KV, and release them."""
        finished, still_running = split_ended(self.running)
        if finished:
            self.running = still_running
            self._plan_in_running_order = False
            for req in finished:
                self.kv.free(req.request_id)
        return finished

    def __repr__(self) -> str:
        c = self.config
        return (f"ContinuousBatcher(max_num_seqs={c.max_num_seqs}, max_num_batched_tokens="
                f"{c.max_num_batched_tokens}, chunked_prefill={c.chunked_prefill}, "
                f"long_prefill_token_threshold={c.long_prefill_token_threshold})")
