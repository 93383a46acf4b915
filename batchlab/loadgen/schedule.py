"""When each request is sent, as ``vllm bench serve`` plans it (vLLM 0.32's ``get_request``).

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from batchlab.checks import check_int, fail, is_number
from batchlab.workloads.arrivals import gamma_gaps

RAMP_UP_STRATEGIES = ("linear", "exponential")


@dataclass(frozen=True)
class Schedule:
    """vLLM's arrival options: ``request_rate`` (req/s, inf = all at once), ``burstiness`` (gamma
    shape, inf = fixed gaps) and an optional ramp-up (then ``request_rate`` must stay inf)."""

    request_rate: float = math.inf
    burstiness: float = 1.0
    ramp_up_strategy: str | None = None
    ramp_up_start_rps: float | None = None
    ramp_up_end_rps: float | None = None

    def __post_init__(self) -> None:
        if not (is_number(self.request_rate) and self.request_rate > 0
                or self.request_rate == math.inf):
            fail("request-rate", self.request_rate,
                 "a positive number of requests per second, or inf")
        if not (is_number(self.burstiness) and self.burstiness > 0 or self.burstiness == math.inf):
            fail("burstiness", self.burstiness,
                 "a positive number (1 = Poisson, < 1 burstier), or inf")
        if self.ramp_up_strategy is None:
            for name in ("ramp_up_start_rps", "ramp_up_end_rps"):
                if getattr(self, name) is not None:
                    fail(name.replace("_", "-"), getattr(self, name),
                         "unset without --ramp-up-strategy",
                         f"give --ramp-up-strategy {' or '.join(RAMP_UP_STRATEGIES)} too")
            return
        if self.ramp_up_strategy not in RAMP_UP_STRATEGIES:
            fail("ramp-up-strategy", self.ramp_up_strategy, f"one of {list(RAMP_UP_STRATEGIES)}")
        if self.request_rate != math.inf:
            fail("request-rate", self.request_rate, "unset (inf) with --ramp-up-strategy",
                 "the ramp-up's start and end rates set the rate")
        start, end = self.ramp_up_start_rps, self.ramp_up_end_rps
        for name, value in (("ramp-up-start-rps", start), ("ramp-up-end-rps", end)):
            if not (is_number(value) and value > 0):
                fail(name, value, "a positive number of requests per second",
                     "--ramp-up-strategy needs both --ramp-up-start-rps and --ramp-up-end-rps")
        if start > end:
            fail("ramp-up-start-rps", start, f"<= ramp-up-end-rps={end}", "a ramp-up goes up")

    @property
    def label(self) -> str:
        """How vLLM names this schedule in its result file: ``2.0qps``, ``infqps``,
        ``ramp-up-linear-1qps-4qps``."""
        if self.ramp_up_strategy:
            return (f"ramp-up-{self.ramp_up_strategy}-{self.ramp_up_start_rps:g}qps-"
                    f"{self.ramp_up_end_rps:g}qps")
        return f"{self.request_rate}qps"

    def rate_at(self, i: int, n: int) -> float:
        """The rate request ``i`` of ``n`` is drawn at (vLLM's ``_get_current_request_rate``)."""
        if self.ramp_up_strategy is None:
            return self.request_rate
        progress = i / max(n - 1, 1)
        start, end = float(self.ramp_up_start_rps), float(self.ramp_up_end_rps)
        if self.ramp_up_strategy == "linear":
            return start + (end - start) * progress
        return start * (end / start) ** progress

    def send_times(self, n: int, seed: int = 0) -> np.ndarray:
        """``n`` send times in seconds after the load starts (sorted; see the module docstring)."""
        check_int("n", n)
        rates = np.array([self.rate_at(i, n) for i in range(n)])
        times = np.cumsum(gamma_gaps(np.random.default_rng(seed), rates, self.burstiness))
        if self.ramp_up_strategy is None and times[-1] != 0:
            times *= (n / self.request_rate) / times[-1]      # the last send at exactly N / rate
        return times
