"""When requests arrive: arrival processes (all start with the first request at ``t = 0``).

- ``"at_once"``: every request at ``t = 0``, like an offline batch job (a saved data set).
- ``"fixed"``: one request every ``1 / rate`` seconds, perfectly regular.
- ``"poisson"``: independent clients. The gaps between arrivals are exponential with mean
  ``1 / rate``; many short gaps, a few long ones. Their *coefficient of variation* (standard
  deviation / mean, CV) is 1.
- ``"gamma"``: gaps drawn from a gamma distribution with shape ``burstiness`` and the same mean
  ``1 / rate`` (as vLLM's ``benchmark_serving`` does). The CV of the gaps is
  ``1 / sqrt(burstiness)``: ``burstiness = 1`` *is* Poisson, ``burstiness < 1`` gives clumps
  of near-simultaneous arrivals separated by long silences (bursty traffic), and
  ``burstiness > 1`` is more regular, approaching ``"fixed"`` as it grows. The average rate is
  the same in every case; only the clumping changes, and clumping is what hurts tail latency.
"""

from __future__ import annotations

import math
from typing import Union

import numpy as np

ARRIVALS = ("at_once", "fixed", "poisson", "gamma")

# A seed is an int, or a Generator to draw from directly.
Seed = Union[int, np.random.Generator]


def _rng(seed: Seed) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0:
        return np.random.default_rng(int(seed))
    raise ValueError(f"seed={seed!r}: must be an int >= 0 or a numpy.random.Generator")


def _child_rngs(seed: Seed, count: int) -> list[np.random.Generator]:
    """Independent random streams, so that changing one choice leaves the others' draws alone."""
    if isinstance(seed, np.random.Generator):
        return list(seed.spawn(count))
    _rng(seed)  # validates
    return [np.random.default_rng(s) for s in np.random.SeedSequence(int(seed)).spawn(count)]


def _check_n(n: int) -> None:
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n={n!r}: the number of requests must be an int >= 1")


def _check_rate(rate: float | None, arrival: str) -> float:
    if rate is None:
        raise ValueError(f"arrival={arrival!r} needs rate= (requests per second, > 0)")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or math.isnan(rate) or rate <= 0:
        raise ValueError(f"rate={rate!r}: must be a number of requests per second > 0 "
                         "(math.inf sends everything at t=0)")
    return float(rate)


def arrivals_at_once(n: int) -> np.ndarray:
    """``n`` arrival times, all 0.0: an offline batch where everything is there from the start."""
    _check_n(n)
    return np.zeros(n)


def arrivals_fixed(n: int, rate: float) -> np.ndarray:
    """``n`` arrivals exactly ``1 / rate`` seconds apart, the first at ``t = 0``."""
    _check_n(n)
    rate = _check_rate(rate, "fixed")
    return np.arange(n) / rate


def arrivals_gamma(n: int, rate: float, burstiness: float, seed: Seed = 0) -> np.ndarray:
    """``n`` arrivals whose gaps are gamma-distributed: shape ``burstiness``, mean ``1 / rate``.

    The first request arrives at ``t = 0`` and each later one a random gap after the previous.
    A gamma gap with shape ``k`` and scale ``1 / (rate * k)`` has mean ``1 / rate`` and
    coefficient of variation ``1 / sqrt(k)``: ``k = 1`` is Poisson, ``k < 1`` is burstier.
    Because the rate only scales the gaps, the same seed at twice the rate gives the same
    pattern squeezed into half the time.
    """
    _check_n(n)
    rate = _check_rate(rate, "gamma")
    if isinstance(burstiness, bool) or not isinstance(burstiness, (int, float)) \
            or not math.isfinite(burstiness) or burstiness <= 0:
        raise ValueError(f"burstiness={burstiness!r}: must be a finite number > 0 "
                         "(1 = Poisson, < 1 burstier, > 1 more regular)")
    rng = _rng(seed)
    if math.isinf(rate):
        return np.zeros(n)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def arrivals_poisson(n: int, rate: float, seed: Seed = 0) -> np.ndarray:
    """``n`` arrivals of a Poisson process at ``rate`` requests/s (exponential gaps), from t = 0.

    This is ``arrivals_gamma`` with ``burstiness = 1`` (a gamma with shape 1 is an exponential),
    so the two give identical times for the same seed.
    """
    return arrivals_gamma(n, rate, 1.0, seed)


def make_arrivals(n: int, arrival: str = "poisson", rate: float | None = None,
                  burstiness: float = 1.0, seed: Seed = 0) -> np.ndarray:
    """Arrival times (seconds, sorted, first at 0) for one of ``ARRIVALS`` by name.

    ``rate`` is needed by all but ``"at_once"``; ``burstiness`` only applies to ``"gamma"``.
    """
    if arrival not in ARRIVALS:
        raise ValueError(f"arrival={arrival!r}: allowed are {', '.join(ARRIVALS)}")
    if arrival != "gamma" and burstiness != 1.0:
        raise ValueError(f"burstiness={burstiness!r} only applies to arrival='gamma' "
                         f"(got arrival={arrival!r})")
    if arrival == "at_once":
        if rate is not None:
            raise ValueError(f"rate={rate!r} has no meaning for arrival='at_once' (all arrive at t=0)")
        return arrivals_at_once(n)
    if arrival == "fixed":
        return arrivals_fixed(n, rate)
    return arrivals_gamma(n, rate, burstiness, seed)  # "poisson" is gamma with burstiness 1
