"""What an engine tells whoever listens: one output per step, and every request as it ends.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchlab.requests import FinishReason, KVCopy, Request
from batchlab.trace import PreemptionRecord, StepRecord


@dataclass(slots=True)
class RequestOutput:
    """What one step did for one request (its tokens are already in ``req.output_ids``)."""

    req: Request
    # one, or a checked draft's accepted tokens and one more
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None   # set on the step whose token ended the request
    num_cached_tokens: int | None = None     # on its first step: prompt tokens it did not compute
    spec: tuple[int, int] | None = None      # (drafted, accepted): the draft this step checked

    @property
    def request_id(self) -> str:
        return self.req.request_id


@dataclass(slots=True)
class StepOutput:
    """One engine step as a listener sees it."""

    step: StepRecord
    outputs: list[RequestOutput]
    preempted: list[PreemptionRecord]        # sent back to waiting while this step was planned


class EngineListener:
    """What an engine reports. Subclass and override; the defaults do nothing."""

    def on_step(self, out: StepOutput) -> None:
        """A step ended at ``out.step.end`` (before the requests it finished are released)."""

    def on_kv_export(self, req: Request, kv: KVCopy) -> None:
        """``req`` (marked ``kv_export``) finished: ``kv`` is its prompt's keys and values, copied
        before its KV space is freed, for a decode worker to pull."""

    def on_end(self, req: Request, t: float) -> None:
        """``req``'s response is complete at ``t``: its ``status``, ``finish_reason`` and
        ``finish_detail`` say how."""
