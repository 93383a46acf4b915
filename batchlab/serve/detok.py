"""Token ids → text as they are generated, with stop strings: the server's detokenizer.

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

from tokenizers.decoders import DecodeStream


class Detokenizer:
    """One response's text, delta by delta (``add`` per token, ``flush`` at the end)."""

    def __init__(self, tokenizer, stop: list[str] | None = None, include_stop: bool = False,
                 skip_special_tokens: bool = True, stop_token_ids: tuple[int, ...] = (),
                 min_tokens: int = 0) -> None:
        self.backend = tokenizer.backend_tokenizer          # the fast tokenizer's Rust core
        self.stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self.skip_special_tokens = skip_special_tokens
        self.stop = list(stop or [])
        self.include_stop = include_stop
        self.stop_token_ids = frozenset(stop_token_ids)    # never shown (vLLM drops them too)
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.min_tokens = min_tokens
        # decoded, not handed out yet (at most ``hold`` chars + one token)
        self.pending = ""
        self.undecoded: list[int] = []   # tokens of a character not complete yet
        self.num_tokens = 0        # tokens added (those after a stop string included)
        self.num_used = 0          # tokens whose text was used (up to the stop string)
        self.stopped = False

    def add(self, token: int) -> str:
        """The text that can be sent now that ``token`` is known ("" while held back)."""
        self.num_tokens += 1
        if self.stopped:
            return ""
        self.num_used = self.num_tokens
        if token in self.stop_token_ids:
            return ""
        piece = self.stream.step(self.backend, token)
        if piece is None:                   # the token ends inside a character: wait for the rest
            self.undecoded.append(token)
            return ""
        self.undecoded.clear()
        self.pending += piece
        if self.stop and self.num_tokens > self.min_tokens:
            # a match ends in the new piece (the text before it was searched, or is too early)
            new_from = len(self.pending) - len(piece)
            hits = [(i, s) for s in self.stop
                    if (i := self.pending.find(s, max(0, new_from - len(s) + 1))) >= 0]
            if hits:
                i, s = min(hits)
                self.stopped = True
                out = self.pending[:i + len(s) if self.include_stop else i]
                self.pending = ""
                return out
        if len(self.pending) <= self.hold:
            return ""
        cut = len(self.pending) - self.hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out

    def flush(self) -> str:
        """At the end of the response: whatever was held back (a character left incomplete by the
        last tokens shows as U+FFFD, as decoding the whole output shows it)."""
        out, self.pending = self.pending, ""
        if self.undecoded and not self.stopped:
            out += self.backend.decode(self.undecoded, skip_special_tokens=self.skip_special_tokens)
            self.undecoded = []
        return out
