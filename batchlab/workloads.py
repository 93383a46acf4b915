"""Workloads: who asks what, and when. Arrival processes, length presets, and JSONL traces.

A serving benchmark is only as meaningful as its workload. Two things describe one:

**When requests arrive** (an *arrival process*). Real clients do not arrive on a metronome.
batchlab offers four processes, all starting with the first request at ``t = 0``:

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

**How long each request is** (a *length preset*): prompt tokens in, output tokens out. The
presets follow the course's article: ``prefill_heavy`` (2,000 in / 20 out) presses on prefill,
``decode_heavy`` (20 in / 2,000 out) on decode, although the totals are alike; ``mixed_output``
mixes 5-token and 500-token answers (what hurts request-level batching); ``same_length`` gives
every request the same lengths (like an image generator's fixed step count, where request-level
batching wastes nothing); ``chat`` is a mix of short and medium prompts and answers. Each preset
exists at two scales: ``"full"`` for the simulator and ``"cpu"``, shrunk so that the real 135M
model on 2 CPU cores serves 16-32 requests in seconds to tens of seconds (see ``PRESETS``).

Requests made without a tokenizer are *simulated*: they carry ``prompt_len`` only. With a
tokenizer, each prompt is real English text: a window of exactly ``prompt_len`` tokens cut from
``data/corpus.txt``. Which window is chosen depends only on the request id (see
``prompt_seed``), so a trace that stores lengths only rebuilds the same prompts for any
tokenizer, every time.

Typical use::

    reqs = make_workload(16, "chat", arrival="poisson", rate=2.0, seed=0, tokenizer=tok)
    save_workload(reqs, "my_trace.jsonl")          # the file schema is in data/README.md
    again = load_workload("my_trace.jsonl", tokenizer=tok)
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np

from .requests import Request, SamplingParams

CORPUS_PATH = Path(__file__).resolve().parent.parent / "data" / "corpus.txt"

ARRIVALS = ("at_once", "fixed", "poisson", "gamma")
SCALES = ("cpu", "full")

# A seed is an int (reproducible) or a numpy Generator (drawn from, so it advances).
Seed = Union[int, np.random.Generator]
# A prompt source makes ``length`` token ids from a generator seeded for one request.
PromptSource = Callable[[int, np.random.Generator], list[int]]


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


# =============================================================================================
# Arrival processes
# =============================================================================================

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


# =============================================================================================
# Length distributions and presets
# =============================================================================================

def _check_token_count(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{what}={value!r}: must be an int >= 1 (a number of tokens)")


@dataclass(frozen=True)
class Fixed:
    """Every request gets exactly ``tokens`` tokens."""

    tokens: int

    def __post_init__(self) -> None:
        _check_token_count(self.tokens, "Fixed.tokens")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(n, self.tokens, dtype=np.int64)

    @property
    def mean(self) -> float:
        return float(self.tokens)


@dataclass(frozen=True)
class Range:
    """Every whole number of tokens from ``low`` to ``high`` (both included) is equally likely."""

    low: int
    high: int

    def __post_init__(self) -> None:
        _check_token_count(self.low, "Range.low")
        _check_token_count(self.high, "Range.high")
        if self.high < self.low:
            raise ValueError(f"Range(low={self.low}, high={self.high}): high must be >= low")

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
            raise ValueError("Mixture(parts=()): needs at least one (weight, distribution) pair")
        for weight, dist in self.parts:
            if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight > 0):
                raise ValueError(f"Mixture weight {weight!r}: must be a finite number > 0")
            if not isinstance(dist, (Fixed, Range, Mixture)):
                raise ValueError(f"Mixture part {dist!r}: must be a Fixed, Range or Mixture")

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
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        _check_token_count(value, what)
        return Fixed(int(value))
    raise ValueError(f"{what}={value!r}: must be an int >= 1 or a Fixed, Range or Mixture")


@dataclass(frozen=True)
class LengthPreset:
    """A named pair of length distributions: prompt tokens in, output tokens out."""

    name: str
    scale: str
    prompt_len: LengthDist
    output_len: LengthDist
    about: str = ""

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ValueError(f"LengthPreset {self.name!r}: scale={self.scale!r}; allowed are "
                             f"{', '.join(SCALES)}")
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
    if scale not in PRESETS:
        raise ValueError(f"scale={scale!r}: allowed are {', '.join(SCALES)}")
    if name not in PRESETS[scale]:
        raise ValueError(f"preset {name!r} does not exist; allowed are "
                         f"{', '.join(PRESETS[scale])}")
    return PRESETS[scale][name]


# =============================================================================================
# Prompt text: windows of the corpus
# =============================================================================================

def prompt_seed(request_id: str) -> int:
    """The seed that picks a request's prompt text: a stable hash (CRC-32) of its id.

    Because it depends on the id alone, a trace stores lengths only and still rebuilds the
    same prompts; the same id at another length starts at the same place in the corpus.
    """
    return zlib.crc32(request_id.encode("utf-8"))


def _encode_function(tokenizer: Any) -> Callable[[str], list[int]]:
    """Turn a tokenizer into ``encode(text) -> ids``: a Hugging Face tokenizer, any object with
    an ``encode(text)`` method, or a plain callable."""
    encode = getattr(tokenizer, "encode", None)
    if encode is not None:
        if hasattr(tokenizer, "all_special_ids"):
            # A Hugging Face tokenizer: no BOS/EOS markers inside a window of running text.
            return lambda text: list(encode(text, add_special_tokens=False))
        return encode
    if callable(tokenizer):
        return tokenizer
    raise TypeError(f"tokenizer {tokenizer!r}: must have an encode(text) method or be a callable "
                    "text -> list of token ids")


def _vocab_size(tokenizer: Any) -> int | None:
    """Number of valid token ids, if the tokenizer says (``len()`` counts added tokens too)."""
    if hasattr(tokenizer, "__len__"):
        return len(tokenizer)
    size = getattr(tokenizer, "vocab_size", None)
    return int(size) if size is not None else None


class CorpusPrompts:
    """A prompt source: windows of real English text from ``data/corpus.txt``.

    ``prompts(length, rng)`` picks a word in the corpus at random (with ``rng``) and returns the
    first ``length`` tokens of the text starting there. The corpus wraps around at its end, so any
    length works; the window may end in the middle of a word, as a cut always can.
    """

    def __init__(self, tokenizer: Any, corpus_path: str | Path = CORPUS_PATH) -> None:
        self.encode = _encode_function(tokenizer)
        self.vocab_size = _vocab_size(tokenizer)
        self.text = Path(corpus_path).read_text(encoding="utf-8").strip()
        if not self.text:
            raise ValueError(f"corpus {corpus_path} is empty")
        self.word_starts = [m.start() for m in re.finditer(r"\S+", self.text)]

    def text_from(self, start: int, num_chars: int) -> str:
        """``num_chars`` characters of the corpus from ``start``, going round to the beginning."""
        ring = self.text + "\n\n"
        repeats = (start + num_chars) // len(ring) + 1
        return (ring * repeats)[start:start + num_chars]

    def __call__(self, length: int, rng: np.random.Generator) -> list[int]:
        _check_token_count(length, "prompt length")
        start = self.word_starts[int(rng.integers(len(self.word_starts)))]
        num_chars = 4 * length + 64  # English averages about 4 characters per token; grow if short
        while True:
            ids = [int(t) for t in self.encode(self.text_from(start, num_chars))]
            if len(ids) >= length:
                return ids[:length]
            num_chars *= 2


def _check_prompt_ids(ids: Any, length: int, vocab_size: int | None, request_id: str) -> list[int]:
    if not isinstance(ids, list) or len(ids) != length:
        got = len(ids) if isinstance(ids, list) else type(ids).__name__
        raise ValueError(f"request {request_id!r}: the prompt source returned {got} ids; "
                         f"wanted a list of exactly {length}")
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0 \
                or (vocab_size is not None and t >= vocab_size):
            allowed = f"0..{vocab_size - 1}" if vocab_size is not None else ">= 0"
            raise ValueError(f"request {request_id!r}: token id {t!r} is outside the vocabulary "
                             f"({allowed})")
    return [int(t) for t in ids]


def _prompt_source(tokenizer: Any, prompt_source: PromptSource | None) -> PromptSource | None:
    if tokenizer is not None and prompt_source is not None:
        raise ValueError("give tokenizer= (prompts cut from the corpus) or prompt_source=, not both")
    if tokenizer is not None:
        return CorpusPrompts(tokenizer)
    if prompt_source is not None and not callable(prompt_source):
        raise ValueError(f"prompt_source={prompt_source!r}: must be a callable (length, rng) -> ids")
    return prompt_source


def _make_prompt(source: PromptSource, request_id: str, length: int) -> list[int]:
    vocab_size = getattr(source, "vocab_size", None)
    ids = source(length, np.random.default_rng(prompt_seed(request_id)))
    return _check_prompt_ids(ids, length, vocab_size, request_id)


# =============================================================================================
# Making workloads
# =============================================================================================

def request_ids(n: int, prefix: str = "r") -> list[str]:
    """Stable ids ``r000, r001, ...`` (more digits when ``n > 1000``), so they sort in order."""
    _check_n(n)
    width = max(3, len(str(n - 1)))
    return [f"{prefix}{i:0{width}d}" for i in range(n)]


def make_workload(n: int, preset: str | LengthPreset | None = None, *, scale: str = "cpu",
                  prompt_len: LengthDist | int | None = None,
                  output_len: LengthDist | int | None = None,
                  arrival: str = "poisson", rate: float | None = None, burstiness: float = 1.0,
                  seed: Seed = 0, tokenizer: Any = None, prompt_source: PromptSource | None = None,
                  sampling: SamplingParams | None = None, id_prefix: str = "r") -> list[Request]:
    """``n`` requests sorted by arrival, with ids ``r000, r001, ...``, reproducible from ``seed``.

    Lengths come from ``preset`` (a name for ``get_preset(name, scale)`` or a ``LengthPreset``);
    ``prompt_len`` / ``output_len`` (an int or a distribution) replace the preset's, or stand
    alone when there is no preset. ``output_len`` becomes each request's ``max_new_tokens``.

    Arrivals: ``arrival`` is one of ``ARRIVALS``; ``rate`` in requests/s; ``burstiness`` for
    ``"gamma"`` only. Arrivals, prompt lengths, output lengths and sampling seeds are drawn from
    separate random streams of ``seed``, so a different rate or arrival process keeps the very
    same requests (lengths and prompts) and only moves them in time.

    Prompts: with neither ``tokenizer`` nor ``prompt_source`` the requests are simulated
    (``prompt_ids=None``). With ``tokenizer`` the prompts are corpus text (``CorpusPrompts``);
    ``prompt_source(length, rng)`` is any other source. Either way ``rng`` is seeded by the
    request id (``prompt_seed``).

    ``sampling`` applies to every request (default greedy). If it samples (temperature > 0) and
    has no seed, each request gets its own seed drawn from ``seed``, so runs are reproducible.
    """
    _check_n(n)
    if not isinstance(id_prefix, str):
        raise ValueError(f"id_prefix={id_prefix!r}: must be a string")
    if isinstance(preset, str):
        preset = get_preset(preset, scale)
    elif preset is not None and not isinstance(preset, LengthPreset):
        raise ValueError(f"preset={preset!r}: must be a preset name, a LengthPreset, or None")
    if preset is None and (prompt_len is None or output_len is None):
        raise ValueError("without a preset, give both prompt_len= and output_len= "
                         f"(got prompt_len={prompt_len!r}, output_len={output_len!r})")
    prompt_dist = _as_length_dist(prompt_len if prompt_len is not None else preset.prompt_len,
                                  "prompt_len")
    output_dist = _as_length_dist(output_len if output_len is not None else preset.output_len,
                                  "output_len")
    if sampling is None:
        sampling = SamplingParams()
    elif not isinstance(sampling, SamplingParams):
        raise ValueError(f"sampling={sampling!r}: must be a SamplingParams or None")
    source = _prompt_source(tokenizer, prompt_source)

    arrival_rng, prompt_rng, output_rng, sampling_rng = _child_rngs(seed, 4)
    arrivals = make_arrivals(n, arrival, rate, burstiness, arrival_rng)
    prompt_lens = prompt_dist.sample(n, prompt_rng)
    output_lens = output_dist.sample(n, output_rng)
    sampling_seeds = sampling_rng.integers(0, 2**31 - 1, size=n)

    requests = []
    for i, request_id in enumerate(request_ids(n, id_prefix)):
        params = sampling
        if not sampling.greedy and sampling.seed is None:
            params = SamplingParams(sampling.temperature, sampling.top_p, int(sampling_seeds[i]))
        length = int(prompt_lens[i])
        ids = None if source is None else _make_prompt(source, request_id, length)
        requests.append(Request(request_id, ids, int(output_lens[i]), float(arrivals[i]),
                                params, prompt_len=length))
    return requests  # already sorted: arrival times are non-decreasing by construction


def scale_arrivals(requests: Iterable[Request], factor: float) -> list[Request]:
    """Fresh copies with every arrival time multiplied by ``factor``.

    ``factor = 0.5`` doubles the offered rate (same requests, same pattern, half the time);
    this is how a load sweep serves identical requests at several rates.
    """
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) \
            or not math.isfinite(factor) or factor < 0:
        raise ValueError(f"factor={factor!r}: must be a finite number >= 0")
    out = []
    for req in requests:
        copy = req.fresh_copy()
        copy.arrival_time = req.arrival_time * factor
        out.append(copy)
    return out


# =============================================================================================
# JSONL traces (schema: data/README.md)
# =============================================================================================

TRACE_FORMAT = "batchlab-workload"
TRACE_VERSION = 1
_REQUIRED_KEYS = ("request_id", "arrival_time", "prompt_len", "max_new_tokens")
_OPTIONAL_KEYS = ("prompt_ids", "sampling", "stop_token_ids")
_SAMPLING_KEYS = ("temperature", "top_p", "seed")


def save_workload(requests: Iterable[Request], path: str | Path, *, meta: Mapping | None = None,
                  include_prompt_ids: bool = False) -> Path:
    """Write requests as JSONL: a header line, then one request per line in the given order.

    Stored: id, arrival time (to the microsecond), prompt length, max new tokens, and the
    sampling parameters and stop tokens when they differ from the defaults. Prompt ids are left
    out unless ``include_prompt_ids`` (the trace then stays tokenizer-independent, and
    ``load_workload`` rebuilds corpus prompts from the ids). ``meta`` is any JSON-able record of
    how the workload was made. The output is byte-identical for identical inputs.
    """
    requests = list(requests)
    header = {"format": TRACE_FORMAT, "version": TRACE_VERSION, "num_requests": len(requests),
              "meta": dict(meta or {})}
    lines = [json.dumps(header, sort_keys=True)]
    for req in requests:
        row: dict[str, Any] = {"request_id": req.request_id,
                               "arrival_time": round(req.arrival_time, 6),
                               "prompt_len": req.prompt_len,
                               "max_new_tokens": req.max_new_tokens}
        if include_prompt_ids and req.prompt_ids is not None:
            row["prompt_ids"] = req.prompt_ids
        if req.sampling != SamplingParams():
            row["sampling"] = {"temperature": req.sampling.temperature, "top_p": req.sampling.top_p,
                               "seed": req.sampling.seed}
        if req.stop_token_ids:
            row["stop_token_ids"] = list(req.stop_token_ids)
        lines.append(json.dumps(row))
    path = Path(path)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def read_trace_header(path: str | Path) -> dict:
    """The header line of a trace (``format``, ``version``, ``num_requests``, ``meta``)."""
    with open(path, encoding="utf-8") as f:
        first = f.readline()
    header = _parse_line(first, path, 1)
    if header.get("format") != TRACE_FORMAT:
        raise ValueError(f"{path}:1: not a {TRACE_FORMAT} header: {first.strip()[:80]!r}")
    return header


def _parse_line(line: str, path: str | Path, lineno: int) -> dict:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg}): {line.strip()[:80]!r}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}:{lineno}: must be a JSON object, got {line.strip()[:80]!r}")
    return obj


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def load_workload(path: str | Path, tokenizer: Any = None,
                  prompt_source: PromptSource | None = None) -> list[Request]:
    """Read a trace written by ``save_workload`` (or by hand; schema in ``data/README.md``).

    Checks every line and raises ``ValueError`` naming the file, line and bad value for: bad
    JSON, missing or unknown keys, ids that are empty or repeated, lengths that are not ints >= 1,
    arrival times that are negative or out of order, bad sampling values, and a request count
    that disagrees with the header. Lines without ``prompt_ids`` become simulated requests,
    unless ``tokenizer`` (corpus text) or ``prompt_source`` is given to rebuild their prompts.
    """
    source = _prompt_source(tokenizer, prompt_source)
    vocab_size = getattr(source, "vocab_size", None)
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if not lines or not lines[0].strip():
        raise ValueError(f"{path}:1: empty file; the first line must be the {TRACE_FORMAT} header")
    header = _parse_line(lines[0], path, 1)
    if header.get("format") != TRACE_FORMAT:
        raise ValueError(f"{path}:1: the first line must be a header with "
                         f"\"format\": \"{TRACE_FORMAT}\", got {lines[0].strip()[:80]!r}")
    if header.get("version") != TRACE_VERSION:
        raise ValueError(f"{path}:1: version={header.get('version')!r}; this code reads version "
                         f"{TRACE_VERSION}")

    requests: list[Request] = []
    seen: dict[str, int] = {}
    last_arrival = 0.0
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue  # tolerate blank lines (e.g. a trailing one added by an editor)
        row = _parse_line(line, path, lineno)
        where = f"{path}:{lineno}"
        missing = [k for k in _REQUIRED_KEYS if k not in row]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        unknown = sorted(set(row) - set(_REQUIRED_KEYS) - set(_OPTIONAL_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed are "
                             f"{', '.join(_REQUIRED_KEYS + _OPTIONAL_KEYS)}")
        request_id = row["request_id"]
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"{where}: request_id={request_id!r}; must be a non-empty string")
        if request_id in seen:
            raise ValueError(f"{where}: request_id {request_id!r} repeats line {seen[request_id]}")
        seen[request_id] = lineno
        arrival = row["arrival_time"]
        if isinstance(arrival, bool) or not isinstance(arrival, (int, float)) \
                or not math.isfinite(arrival) or arrival < 0:
            raise ValueError(f"{where}: arrival_time={arrival!r}; must be a finite number of "
                             "seconds >= 0")
        if arrival < last_arrival:
            raise ValueError(f"{where}: arrival_time={arrival!r} is earlier than the line before "
                             f"({last_arrival!r}); requests must be sorted by arrival time")
        last_arrival = arrival
        for key in ("prompt_len", "max_new_tokens"):
            if not _is_int(row[key]) or row[key] < 1:
                raise ValueError(f"{where}: {key}={row[key]!r}; must be an int >= 1")
        sampling = SamplingParams()
        if "sampling" in row:
            given = row["sampling"]
            if not isinstance(given, dict) or set(given) - set(_SAMPLING_KEYS):
                raise ValueError(f"{where}: sampling={given!r}; must be an object with keys from "
                                 f"{', '.join(_SAMPLING_KEYS)}")
            try:
                sampling = SamplingParams(**given)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
        stops = row.get("stop_token_ids", [])
        if not isinstance(stops, list) or not all(_is_int(t) and t >= 0 for t in stops):
            raise ValueError(f"{where}: stop_token_ids={stops!r}; must be a list of ints >= 0")
        ids = row.get("prompt_ids")
        if ids is not None:
            if not isinstance(ids, list) or len(ids) != row["prompt_len"] \
                    or not all(_is_int(t) and t >= 0 for t in ids):
                raise ValueError(f"{where}: prompt_ids must be a list of {row['prompt_len']} ints "
                                 f">= 0 (prompt_len), got {str(ids)[:60]}")
            try:
                _check_prompt_ids(ids, row["prompt_len"], vocab_size, request_id)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
        elif source is not None:
            ids = _make_prompt(source, request_id, row["prompt_len"])
        requests.append(Request(request_id, ids, row["max_new_tokens"], float(arrival), sampling,
                                prompt_len=row["prompt_len"], stop_token_ids=tuple(stops)))

    expected = header.get("num_requests")
    if expected is not None and expected != len(requests):
        raise ValueError(f"{path}: the header says num_requests={expected!r} but the file holds "
                         f"{len(requests)} requests (truncated or edited?)")
    return requests
