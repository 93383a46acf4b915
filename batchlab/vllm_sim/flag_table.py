"""What each of vLLM's scheduling flags is called elsewhere, and what it defaults to
(``FLAG_TABLE``).

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

import pandas as pd


# Each row: batchlab's knob, vLLM's flag, vLLM V1's default (0.32, OpenAI server), SGLang's flag,
# and the setting the course's earlier notebooks mostly use. Defaults from vLLM's
# ``EngineArgs.get_batch_defaults`` (engine/arg_utils.py) and ``CacheConfig``; SGLang's from its
# ``ServerArgs`` (server_args.py).
FLAG_TABLE = pd.DataFrame(
    [("ContinuousBatcher(max_num_seqs=)", "--max-num-seqs",
      "128 on CPU; 256 on most GPUs; 1024 on H100/H200",
      "--max-running-requests", "4-32 (a small CPU batch)"),
     ("ContinuousBatcher(max_num_batched_tokens=)", "--max-num-batched-tokens",
      "2048 on CPU and most GPUs; 8192 on H100/H200",
      "--chunked-prefill-size (per chunk), --max-prefill-tokens",
      "64-512 (small, to show chunking)"),
     ("ContinuousBatcher(chunked_prefill=)",
      "--enable-chunked-prefill / --no-enable-chunked-prefill",
      "on", "--chunked-prefill-size -1 turns it off", "both, compared (notebook 06)"),
     ("SimBackend(enable_prefix_caching=), paged KV",
      "--enable-prefix-caching / --no-enable-prefix-caching",
      "on (block size 128 on CPU, 16 on GPU)", "--disable-radix-cache turns it off",
      "off, except notebook 05's prefix section"),
     ("(per request) no sharing", "request field cache_salt", "none: requests share", "-", "-"),
     ("(slot or block KV budget)", "VLLM_CPU_KVCACHE_SPACE (CPU), --gpu-memory-utilization (GPU)",
      "CPU: set from free memory and --gpu-memory-utilization; GPU: 0.9 of it",
      "--mem-fraction-static", "sized per notebook"),
     ("(eager step)", "--enforce-eager", "off: torch.compile and CUDA graphs",
      "--disable-cuda-graph; "
      "--enable-torch-compile", "eager")],
    columns=["batchlab", "vLLM flag", "vLLM V1 default", "SGLang", "earlier notebooks"])

__all__ = ["FLAG_TABLE"]
