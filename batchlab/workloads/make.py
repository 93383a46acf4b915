"""A workload: ``n`` requests with arrival times, lengths and prompts, reproducible from a seed.

Typical use::

    reqs = make_workload(16, "chat", arrival="poisson", rate=2.0, seed=0, tokenizer=tok)
    save_workload(reqs, "my_workload.jsonl")       # the file schema is in data/README.md
    again = load_workload("my_workload.jsonl", tokenizer=tok)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from batchlab.checks import check_instance, check_int, check_number, fail
from batchlab.requests import Request, SamplingParams
from batchlab.workloads.arrivals import Seed, _child_rngs, make_arrivals
from batchlab.workloads.lengths import LengthDist, LengthPreset, _as_length_dist, get_preset
from batchlab.workloads.prompts import PromptSource, _make_prompt, _prompt_source


def request_ids(n: int, prefix: str = "r") -> list[str]:
    """Stable ids ``r000, r001, ...`` (more digits when ``n > 1000``), so they sort in order."""
    check_int("n", n, hint="the number of requests")
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
    check_int("n", n, hint="the number of requests")
    check_instance("id_prefix", id_prefix, str, "a string")
    if isinstance(preset, str):
        preset = get_preset(preset, scale)
    check_instance("preset", preset, LengthPreset, "a preset name or a LengthPreset",
                   allow_none=True)
    if preset is None and (prompt_len is None or output_len is None):
        missing = "prompt_len" if prompt_len is None else "output_len"
        fail(missing, None, "an int >= 1 or a Fixed, Range or Mixture",
             "without a preset, give both prompt_len= and output_len=")
    prompt_dist = _as_length_dist(prompt_len if prompt_len is not None else preset.prompt_len,
                                  "prompt_len")
    output_dist = _as_length_dist(output_len if output_len is not None else preset.output_len,
                                  "output_len")
    check_instance("sampling", sampling, SamplingParams, "a SamplingParams", allow_none=True)
    if sampling is None:
        sampling = SamplingParams()
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
    check_number("factor", factor)
    out = []
    for req in requests:
        copy = req.fresh_copy()
        copy.arrival_time = req.arrival_time * factor
        out.append(copy)
    return out
