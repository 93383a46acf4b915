"""When requests arrive: arrival processes (all start with the first request at ``t = 0``).

The rules and their reasons: ``docs/workloads-and-metrics.md``.
"""

from __future__ import annotations

import math
from typing import Union

import numpy as np

from batchlab.checks import check_choice, check_int, check_number, fail

ARRIVALS = ("at_once", "fixed", "poisson", "gamma")

# A seed is an int, or a Generator to draw from directly.
Seed = Union[int, np.random.Generator]


def _rng(seed: Seed) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    check_int("seed", seed, minimum=0, hint="or a numpy.random.Generator")
    return np.random.default_rng(int(seed))


def _child_rngs(seed: Seed, count: int) -> list[np.random.Generator]:
    """Independent random streams, so that changing one choice leaves the others' draws alone."""
    if isinstance(seed, np.random.Generator):
        return list(seed.spawn(count))
    _rng(seed)  # validates
    return [np.random.default_rng(s) for s in np.random.SeedSequence(int(seed)).spawn(count)]


def _check_rate(rate: float | None, arrival: str) -> float:
    """The rate an ``arrival`` process needs, checked: requests per second > 0, or math.inf."""
    check_number("rate", rate, strict=True, allow_inf=True,
                 hint=f"requests per second, needed by arrival={arrival!r}; math.inf sends "
                      "everything at t=0")
    return float(rate)


def arrivals_at_once(n: int) -> np.ndarray:
    """``n`` arrival times, all 0.0: an offline batch where everything is there from the start."""
    check_int("n", n, hint="the number of requests")
    return np.zeros(n)


def arrivals_fixed(n: int, rate: float) -> np.ndarray:
    """``n`` arrivals exactly ``1 / rate`` seconds apart, the first at ``t = 0``."""
    check_int("n", n, hint="the number of requests")
    rate = _check_rate(rate, "fixed")
    return np.arange(n) / rate


def gamma_gaps(rng: np.random.Generator, rates: np.ndarray, burstiness: float) -> np.ndarray:
    """One gap per rate: a gamma draw of shape ``burstiness`` and mean ``1 / rate`` (exactly
    ``1 / rate`` at an infinite burstiness, 0 at an infinite rate). The one gap rule of the
    workloads here and of the load client's ``vllm bench serve`` schedule."""
    rates = np.asarray(rates, dtype=float)
    if np.isinf(rates).all():
        return np.zeros(len(rates))
    if math.isinf(burstiness):
        return 1.0 / rates
    return rng.gamma(shape=burstiness, scale=1.0 / (rates * burstiness))


def arrivals_gamma(n: int, rate: float, burstiness: float, seed: Seed = 0) -> np.ndarray:
    """``n`` arrivals whose gaps are gamma-distributed: shape ``burstiness``, mean ``1 / rate``.

    The first request arrives at ``t = 0`` and each later one a random gap after the previous.
    A gamma gap with shape ``k`` and scale ``1 / (rate * k)`` has mean ``1 / rate`` and
    coefficient of variation ``1 / sqrt(k)``: ``k = 1`` is Poisson, ``k < 1`` is burstier.
    Because the rate only scales the gaps, the same seed at twice the rate gives the same
    pattern squeezed into half the time.
    """
    check_int("n", n, hint="the number of requests")
    rate = _check_rate(rate, "gamma")
    check_number("burstiness", burstiness, strict=True,
                 hint="1 = Poisson, < 1 burstier, > 1 more regular")
    return np.concatenate([[0.0],
                           np.cumsum(gamma_gaps(_rng(seed), np.full(n - 1, rate), burstiness))])


def arrivals_poisson(n: int, rate: float, seed: Seed = 0) -> np.ndarray:
    """``n`` arrivals of a Poisson process at ``rate`` requests/s (exponential gaps), from t = 0.

    This is ``arrivals_gamma`` with ``burstiness = 1`` (a gamma with shape 1 is an exponential),
    so the two give identical times for the same seed.
    """
    return arrivals_gamma(n, _check_rate(rate, "poisson"), 1.0, seed)


def make_arrivals(n: int, arrival: str = "poisson", rate: float | None = None,
                  burstiness: float = 1.0, seed: Seed = 0) -> np.ndarray:
    """Arrival times (seconds, sorted, first at 0) for one of ``ARRIVALS`` by name.

    ``rate`` is needed by all but ``"at_once"``; ``burstiness`` only applies to ``"gamma"``.
    """
    check_choice("arrival", arrival, ARRIVALS)
    if arrival != "gamma" and burstiness != 1.0:
        fail("burstiness", burstiness, "1.0 unless arrival='gamma'",
             f"it only applies to arrival='gamma'; got arrival={arrival!r}")
    if arrival == "at_once":
        if rate is not None:
            fail("rate", rate, "None for arrival='at_once'",
                 "all arrive at t=0, so a rate has no meaning")
        return arrivals_at_once(n)
    rate = _check_rate(rate, arrival)
    if arrival == "fixed":
        return arrivals_fixed(n, rate)
    return arrivals_gamma(n, rate, burstiness, seed)  # "poisson" is gamma with burstiness 1
