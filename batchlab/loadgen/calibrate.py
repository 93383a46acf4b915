"""Calibrating the course's cost model from outside: any OpenAI-compatible server, timed by its
client.

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import numpy as np
import pandas as pd

from batchlab.steptime.cost_model import FEATURES, CostModel
from batchlab.checks import check_int
from batchlab.loadgen.client import LoadRequest, run_load
from batchlab.plan import chunk_attention_pairs


@dataclass(frozen=True)
class OutsideInConfig:
    """What to measure: ``prompt_lens`` served alone ``prompt_repeats`` times each;
    ``decode_batches`` (k) concurrent decodes of ``decode_output_len`` tokens from prompts of
    ``decode_prompt_len``; all of it ``rounds`` times over (each row keeps its fastest round)."""

    prompt_lens: tuple[int, ...] = (16, 128, 256, 512)
    prompt_repeats: int = 3
    decode_batches: tuple[int, ...] = (1, 2, 4, 16)
    decode_prompt_len: int = 32
    decode_output_len: int = 40
    rounds: int = 2

    def __post_init__(self) -> None:
        for name in ("prompt_lens", "decode_batches"):
            values = getattr(self, name)
            if not isinstance(values, tuple) or len(values) < 2:
                raise ValueError(f"{name}={values!r}; must be a tuple of at least 2 sizes "
                                 "(a line needs two points)")
            for v in values:
                check_int(name, v)
        check_int("prompt_repeats", self.prompt_repeats)
        check_int("decode_prompt_len", self.decode_prompt_len)
        check_int("decode_output_len", self.decode_output_len, 8,
                  hint="enough tokens to see steady decode gaps")
        check_int("rounds", self.rounds,
                  hint="times the whole set is measured; each row keeps its fastest round")


@dataclass(frozen=True)
class OutsideInCalibration:
    """The fitted cost model and its measurements: ``points`` has one row per measurement
    (``kind``: prefill or decode, ``size``: prompt tokens or k, the features, ``duration`` measured
    (its fastest round), ``spread`` (its slowest round over its fastest), ``predicted``,
    ``rel_error``)."""

    cost_model: CostModel
    points: pd.DataFrame

    @property
    def median_rel_error(self) -> float:
        return float(self.points["rel_error"].abs().median())


def fresh_prompts(tokenizer, n: int, prompt_len: int) -> list[list[int]]:
    """``n`` corpus prompts of exactly ``prompt_len`` tokens, each from a stretch of the corpus
    picked afresh (a prompt's place in the corpus comes from its request id, which holds a
    nonce)."""
    from batchlab.workloads import make_workload
    reqs = make_workload(n, prompt_len=prompt_len, output_len=1, arrival="at_once",
                         tokenizer=tokenizer,
                         id_prefix=f"outside-in-{uuid.uuid4().hex[:12]}-{prompt_len}-")
    return [list(r.prompt_ids) for r in reqs]


def prefill_points(url: str, tokenizer, prompt_lens: tuple[int, ...], repeats: int) -> pd.DataFrame:
    """Lone prompts, one at a time: the median time to the first token per prompt length."""
    rows = []
    for n in prompt_lens:
        reqs = [LoadRequest(f"prefill-{n}-{j}", ids, 1, prompt_len=n)
                for j, ids in enumerate(fresh_prompts(tokenizer, repeats, n))]
        result = run_load(url, reqs, mode="closed", concurrency=1, max_duration=300)
        ttfts = np.array([r.ttft for r in result.records if r.ok and r.ttft is not None])
        if len(ttfts) < repeats:
            raise RuntimeError(f"lone {n}-token prompts at {url}: {result.status_counts()}; "
                               "every one must succeed")
        rows.append(("prefill", n, 1, n, chunk_attention_pairs(0, n), float(np.median(ttfts))))
    return pd.DataFrame(rows, columns=["kind", "size", *FEATURES, "duration"])


def decode_points(url: str, tokenizer, batches: tuple[int, ...], prompt_len: int,
                  output_len: int) -> pd.DataFrame:
    """k requests sent together: the median gap between tokens, past each request's first quarter
    (while the others' prompts may still be computed)."""
    rows = []
    for k in batches:
        reqs = [LoadRequest(f"decode-{k}-{j}", ids, output_len, prompt_len=prompt_len)
                for j, ids in enumerate(fresh_prompts(tokenizer, k, prompt_len))]
        result = run_load(url, reqs, mode="closed", concurrency=k, max_duration=300)
        if not all(r.ok and r.num_tokens == output_len for r in result.records):
            raise RuntimeError(f"{k} concurrent decodes at {url}: {result.status_counts()}; "
                               f"every one must finish with {output_len} tokens (does the "
                               "server take ignore_eos?)")
        skip = output_len // 4
        gaps = np.concatenate([np.diff(r.token_times())[skip:] for r in result.records])
        context = prompt_len + (skip + output_len) / 2            # the middle of the measured gaps
        rows.append(("decode", k, k, k, int(round(k * context)), float(np.median(gaps))))
    return pd.DataFrame(rows, columns=["kind", "size", *FEATURES, "duration"])


def fastest_rounds(rounds: list[pd.DataFrame]) -> pd.DataFrame:
    """One row per measurement from several rounds of the same rows: the fastest round's duration,
    and ``spread``, its slowest round over its fastest."""
    keys = ["kind", "size", *FEATURES]
    table = pd.concat(rounds, ignore_index=True).groupby(keys, sort=False)["duration"]
    return table.agg(duration="min", spread=lambda d: d.max() / d.min()).reset_index()


def calibrate_outside_in(url: str, tokenizer, config: OutsideInConfig | None = None,
                         source: str = "") -> OutsideInCalibration:
    """Measure ``config``'s lone prompts and concurrent decodes at ``url`` and fit ``CostModel``.

    Works on any OpenAI-compatible server that streams and takes ``ignore_eos`` (vLLM, batchlab's,
    SGLang). One warm-up request is sent first, so no measurement meets the first step's one-time
    costs; every round draws new prompts, so none is served from a prefix cache. Returns the fit
    and its error on every measured point.
    """
    config = config or OutsideInConfig()
    if not isinstance(config, OutsideInConfig):
        raise ValueError(f"config={config!r}; must be an OutsideInConfig or None")
    warm = [LoadRequest("warmup", fresh_prompts(tokenizer, 1, max(config.prompt_lens))[0], 4)]
    run_load(url, warm, mode="closed", concurrency=1, max_duration=300)
    points = fastest_rounds([
        pd.concat([prefill_points(url, tokenizer, config.prompt_lens, config.prompt_repeats),
                   decode_points(url, tokenizer, config.decode_batches, config.decode_prompt_len,
                                 config.decode_output_len)], ignore_index=True)
        for _ in range(config.rounds)])
    model = CostModel.fit(points, source=source or f"outside-in calibration of {url}")
    points["predicted"] = model.predict_df(points)
    points["rel_error"] = points["predicted"] / points["duration"] - 1
    return OutsideInCalibration(model, points)
