"""``python -m batchlab.serve``: serve the course's model over an OpenAI-compatible HTTP API.

    python -m batchlab.serve                                  # continuous batching on 127.0.0.1:8000
    python -m batchlab.serve --policy static --batch-size 8   # feel static batching over HTTP
    python -m batchlab.serve --policy dynamic --max-batch-size 8 --batch-timeout 0.1 --release request

    python -m batchlab.serve --paged --enable-prefix-caching --block-size 16   # vLLM-style KV blocks
    python -m batchlab.serve --simulate H100 --paged --enable-prefix-caching   # no model: steps take a
                                     # Llama-3-8B-on-H100 step's predicted time; answers are placeholders
    python -m batchlab.serve --paged --kv-transfer-config '{"kv_connector": "HTTPKVConnector", "kv_role": "kv_both"}'
                                     # a prefill or decode worker behind vllm-router --vllm-pd-disaggregation

SIGTERM or SIGINT (Ctrl-C): admission stops, requests in flight end with finish_reason "abort"
and the reason "server shutting down" in the timings field, then the process exits.
"""

from __future__ import annotations

import argparse
import sys

from batchlab.model.loading import ALLOWED_DTYPES
from batchlab.schedulers import SCHEDULERS
from batchlab.serve.metrics import ADMISSION_REASON, VLLM_ADMISSION_FLAG
from batchlab.serve.config import DEFAULT_MODEL_NAME, RELEASES, ServerConfig
from batchlab.serve.kv_transfer import KVTransferConfig
from batchlab.speculative import SpeculativeConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m batchlab.serve", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (only loopback unless you mean it)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 routes")
    p.add_argument("--model-name", default=DEFAULT_MODEL_NAME, help="the model id clients must send")
    _policy_flags(p)
    _engine_flags(p)
    p.add_argument("--log-level", default="warning")
    return p.parse_args(argv)


def _policy_flags(p: argparse.ArgumentParser) -> None:
    """The policy and its knobs."""
    p.add_argument("--policy", choices=list(SCHEDULERS), default="continuous")
    p.add_argument("--max-num-seqs", type=int, default=32, help="KV slots (continuous: the most running requests)")
    p.add_argument("--max-model-len", type=int, default=1024, help="context window: prompt + output tokens")
    p.add_argument("--max-num-batched-tokens", type=int, default=512, help="continuous: tokens per step")
    p.add_argument("--no-chunked-prefill", action="store_true", help="continuous: a prompt runs in one step")
    p.add_argument("--long-prefill-token-threshold", type=int, default=None,
                   help="continuous: cap on one prompt's tokens per step")
    p.add_argument("--batch-size", type=int, default=8, help="static: requests per batch")
    p.add_argument("--max-batch-size", type=int, default=8, help="dynamic: the most requests per batch")
    p.add_argument("--batch-timeout", type=float, default=0.05, help="dynamic: seconds the oldest request waits")
    p.add_argument("--release", choices=RELEASES, default="batch",
                   help="static/dynamic: hand responses back at batch end, or per request as it finishes")


def _engine_flags(p: argparse.ArgumentParser) -> None:
    """The KV cache, admission, the model, and the optional parts (simulation, P/D, speculation)."""
    p.add_argument("--paged", action="store_true", help="a paged KV cache (blocks) instead of one slot per sequence")
    p.add_argument("--block-size", type=int, default=16, help="paged: tokens per KV block")
    p.add_argument("--enable-prefix-caching", action="store_true",
                   help="paged: share the KV blocks of prompts' common prefixes")
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None,
                   help="the KV cache's size in bytes (default: --max-num-seqs sequences of --max-model-len)")
    p.add_argument("--max-waiting", type=int, default=256,
                   help="waiting requests (not yet running) before new ones get 429, counted in /metrics as "
                        f"vllm:admission_rejections{{reason=\"{ADMISSION_REASON}\"}}; batchlab's own rule: vLLM's "
                        f"{VLLM_ADMISSION_FLAG} caps waiting + running and answers 503")
    p.add_argument("--trace-window", type=int, default=10_000,
                   help="ended requests the engine's trace keeps (older ones are forgotten; /metrics counts all)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    p.add_argument("--dtype", choices=list(ALLOWED_DTYPES), default="auto",
                   help="the model's dtype (auto: $BATCHLAB_DTYPE if set, else what measures fastest here)")
    p.add_argument("--simulate", default=None, metavar="SPEC",
                   help="simulated device: no model weights; each step lasts the time a cost model predicts and "
                        "the generated tokens are placeholders (' x'). SPEC: a GPU preset (H100: Llama-3-8B on "
                        "it), MODEL@DEVICE (Llama-2-7B@A100), or a saved cost model's .json path")
    p.add_argument("--kv-transfer-config", default=None, metavar="JSON",
                   help="disaggregated serving (behind vllm-router --vllm-pd-disaggregation): play the prefill or "
                        "decode part, moving the KV over HTTP; vLLM's JSON, e.g. "
                        "'{\"kv_connector\": \"HTTPKVConnector\", \"kv_role\": \"kv_both\"}' (needs --paged)")
    p.add_argument("--speculative-config", default=None, metavar="JSON",
                   help="speculative decoding, vLLM's JSON, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": "
                        "4, \"prompt_lookup_min\": 2, \"prompt_lookup_max\": 3}', or batchlab's early exit, "
                        "'{\"method\": \"early_exit\", \"num_speculative_tokens\": 3, \"early_exit_layer\": 27}' "
                        "(continuous batching only)")


def parsed(config_type, text: str | None):
    """A JSON flag's typed config (None when not given): parsed here, once, and handed down."""
    return None if text is None else config_type.parse(text)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = ServerConfig(
            policy=args.policy, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
            max_num_batched_tokens=args.max_num_batched_tokens, chunked_prefill=not args.no_chunked_prefill,
            long_prefill_token_threshold=args.long_prefill_token_threshold, batch_size=args.batch_size,
            max_batch_size=args.max_batch_size, batch_timeout=args.batch_timeout, release=args.release,
            max_waiting=args.max_waiting, model_name=args.model_name, paged=args.paged,
            block_size=args.block_size, enable_prefix_caching=args.enable_prefix_caching,
            kv_cache_memory_bytes=args.kv_cache_memory_bytes, trace_window=args.trace_window,
            simulate=args.simulate, kv_transfer_config=parsed(KVTransferConfig, args.kv_transfer_config),
            speculative_config=parsed(SpeculativeConfig, args.speculative_config))
    except ValueError as e:
        print(f"batchlab.serve: {e}", file=sys.stderr)
        return 2
    from batchlab.serve import serve
    serve(config, host=args.host, port=args.port, api_key=args.api_key, threads=args.threads,
          log_level=args.log_level, dtype=args.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
