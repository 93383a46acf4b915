"""How long each request is: length distributions and the course's presets.

The rules and their reasons: ``docs/workloads-and-metrics.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import numpy as np

from batchlab.checks import check_choice, check_instance, check_int, check_number, fail, is_int

SCALES = ("cpu", "full")


@dataclass(frozen=True)
class Fixed:
    """Every request gets exactly ``tokens`` tokens."""

    tokens: int

    def __post_init__(self) -> None:
        check_int("Fixed.tokens", self.tokens, hint="a number of tokens")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(n, self.tokens, dtype=np.int64)

    @property
    def mean(self) -> float:
        return float(self.tokens)


def range_around(length: int, ratio: float) -> tuple[int, int]:
    """vLLM's ``--random-range-ratio``: lengths drawn from ``[floor(length * (1 - ratio)),
    ceil(length * (1 + ratio))]``, both ends included."""
    return math.floor(length * (1 - ratio)), math.ceil(length * (1 + ratio))


@dataclass(frozen=True)
class Range:
    """Every whole number of tokens from ``low`` to ``high`` (both included) is equally likely."""

    low: int
    high: int

    def __post_init__(self) -> None:
        check_int("Range.low", self.low, hint="a number of tokens")
        check_int("Range.high", self.high, hint="a number of tokens")
        if self.high < self.low:
            fail("Range.high", self.high, f">= Range.low={self.low!r}", "both ends are included")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(self.low, self.high, size=n, endpoint=True, dtype=np.int64)

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2


@dataclass(frozen=True)
class Mixture:
    """Each request picks one of ``parts`` with probability ``weight``, then draws from it.

    ``parts`` is a tuple of ``(weight, distribution)``; weights are positive and are normalised,
    e.g. ``Mixture(((0.7, Range(8, 48)), (0.3, Range(48, 160))))`` is "mostly short, some long".
    """

    parts: tuple[tuple[float, "LengthDist"], ...]

    def __post_init__(self) -> None:
        if not self.parts:
            fail("Mixture.parts", self.parts, "at least one (weight, distribution) pair")
        for i, (weight, dist) in enumerate(self.parts):
            check_number(f"Mixture.parts[{i}] weight", weight, strict=True)
            check_instance(f"Mixture.parts[{i}] distribution", dist, (Fixed, Range, Mixture),
                           "a Fixed, Range or Mixture")

    @property
    def probabilities(self) -> np.ndarray:
        weights = np.array([w for w, _ in self.parts], dtype=float)
        return weights / weights.sum()

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        which = rng.choice(len(self.parts), size=n, p=self.probabilities)  # part index per request
        out = np.empty(n, dtype=np.int64)
        for i, (_, dist) in enumerate(self.parts):
            chosen = which == i
            out[chosen] = dist.sample(int(chosen.sum()), rng)
        return out

    @property
    def mean(self) -> float:
        return float(sum(p * d.mean for p, (_, d) in zip(self.probabilities, self.parts)))


LengthDist = Union[Fixed, Range, Mixture]


def _as_length_dist(value: LengthDist | int, what: str) -> LengthDist:
    if isinstance(value, (Fixed, Range, Mixture)):
        return value
    if not is_int(value) or value < 1:
        fail(what, value, "an int >= 1 or a Fixed, Range or Mixture", "a number of tokens")
    return Fixed(int(value))


@dataclass(frozen=True)
class LengthPreset:
    """A named pair of length distributions: prompt tokens in, output tokens out."""

    name: str
    scale: str
    prompt_len: LengthDist
    output_len: LengthDist
    about: str = ""

    def __post_init__(self) -> None:
        check_choice("scale", self.scale, SCALES, hint=f"LengthPreset {self.name!r}")
        _as_length_dist(self.prompt_len, "prompt_len")
        _as_length_dist(self.output_len, "output_len")


def _preset_table(*presets: LengthPreset) -> dict[str, LengthPreset]:
    return {p.name: p for p in presets}


# Full scale: lengths as the article and real chat traffic have them, for the simulator.
# CPU scale: shrunk so the real 135M model on 2 CPU cores runs 16-32 requests in seconds to
# tens of seconds. Dividing everything by 10 would make 2,000-in / 20-out into 200 / 2, and two
# output tokens show nothing, so each CPU preset is chosen by hand to keep its *character*:
#   prefill_heavy  2,000 / 20   ->  400 / 8     (prompt 50x the output; prompts /5, outputs /2.5)
#   decode_heavy      20 / 2,000 ->   8 / 160   (on CPU 160 decode steps already cost far more
#                                                time than a 400-token prefill, so the lesson holds)
#   mixed_output     100 / 5-500 ->  32 / 5-100 (keeps the floor of 5 and a 20x spread)
#   same_length      128 / 128   ->  32 / 32
#   chat          mostly short, some medium; prompts about /6, outputs about /8.
PRESETS: dict[str, dict[str, LengthPreset]] = {
    "full": _preset_table(
        LengthPreset("chat", "full",
                     prompt_len=Mixture(((0.7, Range(16, 256)), (0.3, Range(256, 1024)))),
                     output_len=Mixture(((0.6, Range(16, 128)), (0.4, Range(128, 512)))),
                     about="chat: mostly short questions and answers, some medium ones"),
        LengthPreset("prefill_heavy", "full", Fixed(2000), Fixed(20),
                     about="2,000 tokens in, 20 out: presses on prefill"),
        LengthPreset("decode_heavy", "full", Fixed(20), Fixed(2000),
                     about="20 tokens in, 2,000 out: presses on decode"),
        LengthPreset("mixed_output", "full", Fixed(100), Range(5, 500),
                     about="equal prompts, answers from 5 to 500 tokens"),
        LengthPreset("same_length", "full", Fixed(128), Fixed(128),
                     about="every request alike, like an image generator's fixed step count"),
    ),
    "cpu": _preset_table(
        LengthPreset("chat", "cpu",
                     prompt_len=Mixture(((0.7, Range(8, 48)), (0.3, Range(48, 160)))),
                     output_len=Mixture(((0.6, Range(4, 24)), (0.4, Range(24, 64)))),
                     about="chat: mostly short questions and answers, some medium ones"),
        LengthPreset("prefill_heavy", "cpu", Fixed(400), Fixed(8),
                     about="400 tokens in, 8 out: presses on prefill"),
        LengthPreset("decode_heavy", "cpu", Fixed(8), Fixed(160),
                     about="8 tokens in, 160 out: presses on decode"),
        LengthPreset("mixed_output", "cpu", Fixed(32), Range(5, 100),
                     about="equal prompts, answers from 5 to 100 tokens"),
        LengthPreset("same_length", "cpu", Fixed(32), Fixed(32),
                     about="every request alike, like an image generator's fixed step count"),
    ),
}


def get_preset(name: str, scale: str = "cpu") -> LengthPreset:
    """The length preset ``name`` at ``scale`` (``"cpu"`` for the real model, ``"full"`` for the
    simulator)."""
    check_choice("scale", scale, SCALES)
    check_choice("preset", name, PRESETS[scale])
    return PRESETS[scale][name]
