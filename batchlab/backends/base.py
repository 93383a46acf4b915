"""The contract between the engine and whatever computes a step.

A backend runs a ``StepPlan``: for each chunk it computes the chunk's tokens into the KV cache,
and for each chunk with ``samples=True`` it returns the request's next token. It reports how
long the step took: measured on the real model, predicted by the cost model in the simulator.
It knows nothing about policies.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field

from batchlab.kv_space import KVSpace
from batchlab.plan import StepPlan
from batchlab.requests import KVCopy, Request, TokenLogprobs
from batchlab.speculative import SpeculativeConfig


@dataclass
class StepResult:
    """``new_tokens[request_id]`` for every chunk that samples without a draft; ``duration`` in
    seconds; ``logprobs[request_id]`` for the sampled requests whose ``sampling.logprobs`` asks
    (a list, one per token, for a checked draft).

    Speculative decoding: ``verified[request_id]``, for every chunk with a draft, the tokens its
    check emitted (the accepted draft tokens, then one more: 1 to ``k + 1``);
    ``drafts[request_id]``, the tokens drafted for the request's next step (from the text as it
    stands after this step).
    """

    new_tokens: dict[str, int] = field(default_factory=dict)
    duration: float = 0.0
    logprobs: dict[str, TokenLogprobs | list[TokenLogprobs]] = field(default_factory=dict)
    verified: dict[str, list[int]] = field(default_factory=dict)
    drafts: dict[str, list[int]] = field(default_factory=dict)


class Backend(ABC):
    """Runs step plans. ``kv`` is the KV space schedulers admit against. ``speculative``: the
    speculative-decoding config it drafts with (``batchlab.speculative``), or None."""

    kv: KVSpace
    speculative: SpeculativeConfig | None = None

    @abstractmethod
    def run(self, plan: StepPlan, requests: Mapping[str, Request]) -> StepResult:
        """Compute ``plan``. ``requests`` maps ids to the live requests (read-only here)."""

    def release(self, request_id: str) -> None:
        """``request_id`` has ended (finished or rejected): forget anything kept for it."""

    def read_kv(self, request_id: str, num_tokens: int) -> "KVCopy":
        """A copy of the keys and values of the sequence's first ``num_tokens`` tokens (a
        disaggregated prefill worker hands them to a decode worker); its ``kv`` is None where the
        cache counts tokens only (the simulator's)."""
        table = getattr(self.kv, "block_table", None)
        return KVCopy(None, list(table(request_id)) if table else [])

    def reset(self) -> None:
        """A run is about to start on this backend."""

    def describe(self) -> str:
        """One line saying what this backend is, for a trace's ``meta``."""
        return repr(self)
