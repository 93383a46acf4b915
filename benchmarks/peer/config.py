"""What the benchmark serves and how: its settings, contenders and the seeded workload."""

from __future__ import annotations

from dataclasses import dataclass

from batchlab.checks import check_choice, check_int, check_number, fail, is_int
from batchlab.requests import Request
from batchlab.workloads import Range, make_workload


HF_CONTENDERS = ("hf_sequential", "hf_static", "hf_continuous")
# vLLM's CPU build, in its own venv, as a subprocess (bench/vllm_contender.py): eager, and compiled
# with torch.compile (its default; the course's other vLLM runs are eager, to start in under a minute).
VLLM_CONTENDERS = ("vllm", "vllm_compiled")
BATCHLAB_CONTENDERS = ("batchlab_static", "batchlab_dynamic", "batchlab_continuous")
CONTENDERS = HF_CONTENDERS + VLLM_CONTENDERS + BATCHLAB_CONTENDERS
REFERENCE = "hf_continuous"          # ratios are "contender / this"
# and "contender / vLLM": against the faster of VLLM_CONTENDERS in the run (its best configuration)
GREEDY_REFERENCE = "batchlab_continuous"   # token agreement is checked against this
MODES = ("offline", "online")
DTYPES = ("float32", "bfloat16")
DTYPE_CHOICES = DTYPES + ("both",)

LABELS = {
    "hf_sequential": "transformers generate, 1 at a time",
    "hf_static": "transformers generate, static batches",
    "hf_continuous": "transformers continuous batching",
    "vllm": "vLLM CPU, eager",
    "vllm_compiled": "vLLM CPU, compiled",
    "batchlab_static": "batchlab static",
    "batchlab_dynamic": "batchlab dynamic",
    "batchlab_continuous": "batchlab continuous",
}


TINY = {"num_requests": 4, "prompt_len": Range(6, 20), "output_len": Range(2, 5), "hf_batch_tokens": (64,)}


@dataclass(frozen=True)
class BenchConfig:
    """What to run.

    ``mode``: ``"offline"`` (every request at t = 0) or ``"online"`` (Poisson arrivals at ``rate``
    requests/s, served on the wall clock). ``num_requests``, ``seed``, ``preset``: the workload
    (``make_workload(num_requests, preset, scale="cpu", seed=seed)``). ``only``: contenders to run.
    ``batch_size``: the static/dynamic batch size (transformers' static batches too).
    ``dynamic_timeout``: seconds the dynamic batcher waits for a batch to fill.
    ``max_num_seqs`` / ``max_num_batched_tokens``: batchlab's continuous batcher budgets.
    ``hf_batch_tokens``: the ``max_batch_tokens`` values tried for transformers' continuous batching.
    ``hf_page_size``: tokens per page of its paged KV cache. ``tiny``: a few requests and tokens
    (``TINY``), for the test. ``warmup``: run two tiny requests through each contender first.
    ``threads``: torch CPU threads for every contender (None: leave the process's setting).
    ``profile``: record each timed run's torch ops (``OpProfile``); adds some overhead.
    ``dtype``: the weights' dtype for every contender: ``"float32"``, ``"bfloat16"``, or
    ``"both"`` (every contender in each, one after the other; ``dtypes`` lists them).
    """

    mode: str = "offline"
    num_requests: int = 32
    rate: float = 2.0
    seed: int = 0
    preset: str = "chat"
    only: tuple[str, ...] = CONTENDERS
    batch_size: int = 8
    dynamic_timeout: float = 0.1
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    hf_batch_tokens: tuple[int, ...] = (64, 128, 256, 512)
    hf_page_size: int = 64
    tiny: bool = False
    warmup: bool = True
    threads: int | None = None
    profile: bool = False
    dtype: str = "float32"

    def __post_init__(self) -> None:
        check_choice("dtype", self.dtype, DTYPE_CHOICES)
        check_choice("mode", self.mode, MODES)
        check_int("num_requests", self.num_requests)
        check_number("rate", self.rate, strict=True, hint="requests/s")
        check_int("seed", self.seed, minimum=0)
        unknown = [c for c in self.only if c not in CONTENDERS]
        if unknown or not self.only:
            fail("only", self.only, f"one or more of {list(CONTENDERS)}", f"unknown: {unknown}")
        check_int("threads", self.threads, allow_none=True, hint="None: every core")
        for name in ("batch_size", "max_num_seqs", "max_num_batched_tokens", "hf_page_size"):
            check_int(name, getattr(self, name))
        if not self.hf_batch_tokens or not all(is_int(t) and t >= 1 for t in self.hf_batch_tokens):
            fail("hf_batch_tokens", self.hf_batch_tokens, "one or more ints >= 1")
        check_number("dynamic_timeout", self.dynamic_timeout, hint="seconds")


    @property
    def dtypes(self) -> tuple[str, ...]:
        return DTYPES if self.dtype == "both" else (self.dtype,)


# =============================================================================================
# Workload
# =============================================================================================

def bench_workload(config: BenchConfig, tokenizer) -> list[Request]:
    """The fixed, seeded workload: greedy, no stop tokens, sorted by arrival."""
    if config.mode == "offline":
        arrival = dict(arrival="at_once")
    else:
        arrival = dict(arrival="poisson", rate=config.rate)
    sizes = dict(prompt_len=TINY["prompt_len"], output_len=TINY["output_len"]) if config.tiny else {}
    return make_workload(config.num_requests, config.preset, scale="cpu", seed=config.seed,
                         tokenizer=tokenizer, **arrival, **sizes)


def warmup_workload(tokenizer) -> list[Request]:
    """Two tiny requests (8-token prompts, 2 new tokens) that wake up every code path before timing."""
    return make_workload(2, prompt_len=8, output_len=2, arrival="at_once", seed=12345,
                         tokenizer=tokenizer, id_prefix="warmup")


