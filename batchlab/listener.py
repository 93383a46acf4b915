"""What an engine tells whoever listens: every token as its step ends, every request as it ends.

A server streams from these (``serve/runner.py``); the offline driver's progress bar counts ends.
The methods run on the engine's thread, between steps: they must be quick (hand the token to
another thread, e.g. with ``loop.call_soon_threadsafe``) and must not raise.
"""

from __future__ import annotations

from batchlab.requests import Request


class EngineListener:
    """What an engine reports. Subclass and override; the defaults do nothing."""

    def on_token(self, req: Request, token: int, t: float) -> None:
        """``req`` got ``token`` (already appended to ``req.output_ids``) at time ``t``."""

    def on_tokens(self, req: Request, tokens: list[int], t: float) -> None:
        """``req`` got several ``tokens`` from one step at ``t`` (a checked speculative draft: its
        accepted tokens and one more; already appended). By default, ``on_token`` for each."""
        for token in tokens:
            self.on_token(req, token, t)

    def on_end(self, req: Request, t: float) -> None:
        """``req``'s response is complete at ``t``: its ``status``, ``finish_reason`` and
        ``finish_detail`` say how."""
