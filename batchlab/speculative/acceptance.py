"""How many drafted tokens a check accepts, for the simulator (which has no tokens to compare).

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from batchlab.checks import check_fraction, check_int, check_number


def expected_accepted(alpha: float, k: int) -> float:
    """Mean accepted tokens of a check of ``k`` drafts: ``alpha (1 - alpha^k) / (1 - alpha)``."""
    return float(k) if alpha >= 1 else alpha * (1 - alpha ** k) / (1 - alpha)


@dataclass(frozen=True)
class AcceptanceModel:
    """Acceptance per request and per check (see the module docstring)."""

    rate: float
    concentration: float = 10.0
    draft_rate: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        check_fraction("rate", self.rate, "(0, 1)",
                       hint="the mean chance a drafted token is accepted")
        check_number("concentration", self.concentration, strict=True,
                     hint="Beta a + b; large = all alike")
        check_fraction("draft_rate", self.draft_rate, "[0, 1]",
                       hint="the share of decodes that carry a draft")
        check_int("seed", self.seed, minimum=0)

    def stream(self, request_id: str) -> "AcceptanceStream":
        """One request's draws: its own ``alpha``, and a generator seeded from its id."""
        rng = np.random.default_rng([self.seed, zlib.crc32(request_id.encode())])
        c = self.concentration
        return AcceptanceStream(float(rng.beta(self.rate * c, (1 - self.rate) * c)),
                                self.draft_rate, rng)

    @classmethod
    def fit(cls, checks_by_request: Sequence[Sequence[tuple[int, int]]], num_outputs: Sequence[int],
            seed: int = 0) -> "AcceptanceModel":
        """From measured runs: per request, its ``(drafted, accepted)`` checks and its output
        tokens. ``rate``: the ``alpha`` whose expected accepted tokens, over the checks' own
        ``k``s, equal the measured total; ``concentration``: the method of moments on the
        requests' accepted fractions; ``draft_rate``: checks per decode that could carry one."""
        checks = [c for cs in checks_by_request for c in cs]
        if not checks:
            raise ValueError("no checks to fit: the runs drafted nothing")
        accepted = sum(a for _, a in checks)
        low, high = 1e-6, 1 - 1e-6
        # bisection: expected_accepted rises with alpha
        for _ in range(60):
            mid = (low + high) / 2
            low, high = ((mid, high) if sum(expected_accepted(mid, d) for d, _ in checks) < accepted
                         else (low, mid))
        fractions = [sum(a for _, a in cs) / sum(d for d, _ in cs)
                     for cs in checks_by_request if cs]
        m, v = float(np.mean(fractions)), float(np.var(fractions))
        concentration = float(np.clip(m * (1 - m) / v - 1, 1.0, 1000.0)) if v > 0 else 1000.0
        # each sampling step emits 1 + accepted tokens; the first (the prompt's) can carry no draft
        decodes = sum(n - sum(a for _, a in cs) - 1
                      for cs, n in zip(checks_by_request, num_outputs))
        return cls(round((low + high) / 2, 4), round(concentration, 2),
                   min(1.0, round(len(checks) / max(decodes, 1), 4)), seed)


class AcceptanceStream:
    """One request's acceptance: whether each decode drafts, and how many of a draft it accepts."""

    __slots__ = ("alpha", "draft_rate", "rng")

    def __init__(self, alpha: float, draft_rate: float, rng: np.random.Generator) -> None:
        self.alpha, self.draft_rate, self.rng = alpha, draft_rate, rng

    def drafts(self) -> bool:
        return self.draft_rate >= 1 or self.rng.random() < self.draft_rate

    def accepted(self, k: int) -> int:
        """Leading drafts accepted, each with chance ``alpha``, out of ``k``."""
        a = 0
        while a < k and self.rng.random() < self.alpha:
            a += 1
        return a
