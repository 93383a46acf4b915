"""``python -m batchlab.serve``: serve the course's model over an OpenAI-compatible HTTP API.

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

import argparse
import sys

from batchlab.model.loading import ALLOWED_DTYPES
from batchlab.schedulers import SCHEDULERS
from batchlab.serve.metrics import ADMISSION_REASON, VLLM_ADMISSION_FLAG
from batchlab.engine_args import EngineArgs
from batchlab.serve.config import (DEFAULT_MODEL_NAME, RELEASES, SERVER_DEFAULTS,
                                   SERVER_ENGINE_FLAGS, ServerConfig)
from batchlab.serve.kv_transfer import KVTransferConfig
from batchlab.speculative import SpeculativeConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m batchlab.serve",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (only loopback unless you mean it)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1 routes")
    p.add_argument("--model-name", default=DEFAULT_MODEL_NAME,
                   help="the model id clients must send")
    _policy_flags(p)
    EngineArgs.add_cli_flags(p.add_argument_group("vLLM's flags (the server's defaults where "
                                                  "vLLM's would not fit a laptop)"),
                             SERVER_ENGINE_FLAGS, SERVER_DEFAULTS)
    _engine_flags(p)
    p.add_argument("--log-level", default="warning")
    return p.parse_args(argv)


def _policy_flags(p: argparse.ArgumentParser) -> None:
    """The policy and its knobs."""
    p.add_argument("--policy", choices=list(SCHEDULERS), default="continuous")
    p.add_argument("--batch-size", type=int, default=8, help="static: requests per batch")
    p.add_argument("--max-batch-size", type=int, default=8,
                   help="dynamic: the most requests per batch")
    p.add_argument("--batch-timeout", type=float, default=0.05,
                   help="dynamic: seconds the oldest request waits")
    p.add_argument("--release", choices=RELEASES, default="batch",
                   help="static/dynamic: hand responses back at batch end, or per request as it "
                        "finishes")


def _engine_flags(p: argparse.ArgumentParser) -> None:
    """The KV cache, admission, the model, and the optional parts (simulation, P/D, speculation)."""
    p.add_argument("--paged", action="store_true",
                   help="a paged KV cache (blocks) instead of one slot per sequence")
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None,
                   help="the KV cache's size in bytes (default: --max-num-seqs sequences of "
                        "--max-model-len)")
    p.add_argument("--max-waiting", type=int, default=256,
                   help="waiting requests (not yet running) before new ones get 429, counted in "
                        f"/metrics as vllm:admission_rejections{{reason=\"{ADMISSION_REASON}\"}}; "
                        f"batchlab's own rule: vLLM's {VLLM_ADMISSION_FLAG} caps waiting + running "
                        "and answers 503")
    p.add_argument("--trace-window", type=int, default=10_000,
                   help="ended requests the engine's trace keeps (older ones are forgotten; "
                        "/metrics counts all)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: all cores)")
    p.add_argument("--dtype", choices=list(ALLOWED_DTYPES), default="auto",
                   help="the model's dtype (auto: $BATCHLAB_DTYPE if set, else what measures "
                        "fastest here)")
    p.add_argument("--simulate", default=None, metavar="SPEC",
                   help="simulated device: no model weights; each step lasts the time a cost "
                        "model predicts and the generated tokens are placeholders (' x'). SPEC: "
                        "a GPU preset (H100: Llama-3-8B on it), MODEL@DEVICE (Llama-2-7B@A100), "
                        "or a saved cost model's .json path")
    p.add_argument("--kv-transfer-config", default=None, metavar="JSON",
                   help="disaggregated serving (behind vllm-router --vllm-pd-disaggregation): "
                        "play the prefill or decode part, moving the KV over HTTP; vLLM's JSON, "
                        "e.g. '{\"kv_connector\": \"HTTPKVConnector\", \"kv_role\": \"kv_both\"}' "
                        "(needs --paged)")
    p.add_argument("--speculative-config", default=None, metavar="JSON",
                   help="speculative decoding, vLLM's JSON, e.g. '{\"method\": \"ngram\", "
                        "\"num_speculative_tokens\": 4, \"prompt_lookup_min\": 2, "
                        "\"prompt_lookup_max\": 3}', or batchlab's early exit, "
                        "'{\"method\": \"early_exit\", \"num_speculative_tokens\": 3, "
                        "\"early_exit_layer\": 27}' (continuous batching only)")


def parsed(config_type, text: str | None):
    """A JSON flag's typed config (None when not given)."""
    return None if text is None else config_type.parse(text)


def server_config(args: argparse.Namespace) -> ServerConfig:
    """The parsed flags as the server's config: the JSON ones parsed here, once, then handed
    down."""
    return ServerConfig(
        policy=args.policy, engine=EngineArgs.from_cli(args, SERVER_ENGINE_FLAGS),
        batch_size=args.batch_size,
        max_batch_size=args.max_batch_size, batch_timeout=args.batch_timeout, release=args.release,
        max_waiting=args.max_waiting, model_name=args.model_name, paged=args.paged,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes, trace_window=args.trace_window,
        simulate=args.simulate,
        kv_transfer_config=parsed(KVTransferConfig, args.kv_transfer_config),
        speculative_config=parsed(SpeculativeConfig, args.speculative_config))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = server_config(args)
    except ValueError as e:
        print(f"batchlab.serve: {e}", file=sys.stderr)
        return 2
    from batchlab.serve import serve
    serve(config, host=args.host, port=args.port, api_key=args.api_key, threads=args.threads,
          log_level=args.log_level, dtype=args.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
