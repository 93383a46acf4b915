"""vLLM's engine arguments by vLLM's names: the one type every part of the course reads them from.

``EngineArgs(max_num_seqs=...)`` is ``vllm serve --max-num-seqs ...``. A field at ``None`` is
vLLM's default: left off the command line (``cli_args``), and filled in for a GPU by
``resolved``, as vLLM's ``EngineArgs.get_batch_defaults`` fills it. Parsed once, at the edge
(``add_cli_flags`` / ``from_cli``), then handed down typed.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
from dataclasses import dataclass

from batchlab.checks import check_bool, check_choice, check_fraction, check_int, fail
from batchlab.kv_blocks import check_block_size
from batchlab.shapes import DTYPE_BYTES, ModelShape

LARGE_DEVICE_GIB = 70          # vLLM's larger defaults: at least 70 GiB and not an A100
DTYPES = ("auto", "float32", "float16", "bfloat16")
GPU_DTYPES = ("float16", "bfloat16")
# vLLM takes no --no- form
OFF_BY_DEFAULT = ("enforce_eager", "enable_expert_parallel", "disable_log_stats")
HELP = {
    "max_num_seqs": "the most sequences running at once",
    "max_num_batched_tokens": "the most tokens one step computes (prompt chunks and decodes)",
    "max_model_len": "the context: prompt + output tokens",
    "enable_chunked_prefill": "split a long prompt over steps",
    "long_prefill_token_threshold": ("the most prompt tokens one request computes in a step "
                                     "(chunked prefill)"),
    "enable_prefix_caching": "reuse the KV blocks of a shared prompt prefix",
    "block_size": "tokens per KV block",
    "gpu_memory_utilization": "the share of GPU memory vLLM may use",
    "dtype": "the weights' and KV's dtype",
    "enforce_eager": "no torch.compile, no CUDA graphs",
    "async_scheduling": "plan step N+1 on the CPU while step N runs",
    "enable_expert_parallel": "MoE: whole experts per GPU",
    "disable_log_stats": "no stats logging (and no vllm: counters in /metrics)",
}


@dataclass(frozen=True)
class EngineArgs:
    """vLLM's flags that decide a deployment's speed and memory (``None``: vLLM's default)."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    enable_chunked_prefill: bool | None = None
    long_prefill_token_threshold: int | None = None
    enable_prefix_caching: bool | None = None
    block_size: int | None = None
    gpu_memory_utilization: float | None = None
    dtype: str = "auto"
    enforce_eager: bool | None = None
    async_scheduling: bool | None = None
    enable_expert_parallel: bool | None = None
    disable_log_stats: bool | None = None

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len",
                     "long_prefill_token_threshold"):
            check_int(name, getattr(self, name), allow_none=True, hint=flag(name))
        for f in dataclasses.fields(self):
            if f.type == "bool | None" and getattr(self, f.name) is not None:
                check_bool(f.name, getattr(self, f.name))
        if self.block_size is not None:
            check_block_size(self.block_size)
        if self.gpu_memory_utilization is not None:
            check_fraction("gpu_memory_utilization", self.gpu_memory_utilization,
                           hint=flag("gpu_memory_utilization"))
        check_choice("dtype", self.dtype, DTYPES, hint="--dtype")
        if self.long_prefill_token_threshold is not None and self.enable_chunked_prefill is False:
            fail("long_prefill_token_threshold", self.long_prefill_token_threshold,
                 "None without chunked prefill",
                 "capping a prompt's tokens per step means splitting the prompt")
        seqs, budget = self.max_num_seqs, self.max_num_batched_tokens
        if seqs is not None and budget is not None and budget < seqs:
            fail("max_num_batched_tokens", budget, f">= max_num_seqs={seqs}",
                 "vLLM refuses a budget smaller "
                 "than its batch")

    def cli_args(self) -> list[str]:
        """``vllm serve``'s arguments for these flags (those at vLLM's default left out)."""
        out: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if (value is None or value is False and f.name in OFF_BY_DEFAULT
                    or f.name == "dtype" and value == "auto"):
                continue
            if isinstance(value, bool):
                out.append(flag(f.name) if value else flag(f.name).replace("--", "--no-", 1))
            else:
                out += [flag(f.name), str(value)]
        return out

    @staticmethod
    def add_cli_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                      names: tuple[str, ...] | None = None,
                      defaults: "EngineArgs | None" = None) -> None:
        """vLLM's flags for these fields (``names``: only those), each defaulting to ``None``; the
        help names what ``None`` stands for (``defaults``' value, else vLLM's default)."""
        for f in dataclasses.fields(EngineArgs):
            if names is not None and f.name not in names:
                continue
            shown = getattr(defaults, f.name) if defaults is not None else None
            text = HELP[f.name] + (f" (default: {shown})" if shown is not None
                                   else " (default: vLLM's)")
            if f.name in OFF_BY_DEFAULT:
                parser.add_argument(flag(f.name), action="store_true", default=None,
                                    help=HELP[f.name])
            elif f.type == "bool | None":
                parser.add_argument(flag(f.name), action=argparse.BooleanOptionalAction, help=text)
            elif f.name == "dtype":
                parser.add_argument(flag(f.name), default="auto", choices=DTYPES, help=HELP[f.name])
            else:
                kind = float if f.type.startswith("float") else int
                parser.add_argument(flag(f.name), type=kind, help=text)

    @classmethod
    def from_cli(cls, namespace: argparse.Namespace,
                 names: tuple[str, ...] | None = None) -> "EngineArgs":
        """The flags ``add_cli_flags(parser, names)`` added, as ``parser`` read them into
        ``namespace``."""
        return cls(**{f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls)
                      if names is None or f.name in names})

    def resolved(self, device_name: str, device_memory_gib: float,
                 model: ModelShape) -> "EngineArgs":
        """These flags with vLLM V1's defaults for a GPU and ``model`` filled in, and checked
        together (vLLM refuses a token budget under the context without chunked prefill)."""
        large = device_memory_gib >= LARGE_DEVICE_GIB and "a100" not in device_name.lower()
        max_len = self.max_model_len or model.max_model_len
        if max_len is None:
            fail("max_model_len", None, "an int >= 1", f"{model.name}'s config gives no "
                 "max_position_embeddings: pass --max-model-len")
        if model.max_model_len is not None and max_len > model.max_model_len:
            fail("max_model_len", max_len, f"<= {model.max_model_len}",
                 f"{model.name}'s max_position_embeddings; vLLM refuses a longer context")
        chunked = self.enable_chunked_prefill is not False
        budget = self.max_num_batched_tokens or ((8192 if large else 2048) if chunked
                                                 else max(max_len, 2048))
        # vLLM caps its default by the budget
        seqs = self.max_num_seqs or min(1024 if large else 256, budget)
        if not chunked and budget < max_len:
            fail("max_num_batched_tokens", budget, f">= max_model_len={max_len}",
                 "without chunked prefill a whole prompt runs in one step")
        dtype = model.dtype if self.dtype == "auto" else self.dtype
        if self.dtype == "float32":
            fail("dtype", self.dtype, f"one of {('auto', *GPU_DTYPES)}",
                 "the GPU kernels are measured in 16 bits")
        if dtype not in GPU_DTYPES:
            dtype = "bfloat16"   # a float32 checkpoint is served in bf16 by vLLM's "auto" on a GPU
        return dataclasses.replace(
            self, max_num_seqs=seqs, max_num_batched_tokens=budget, max_model_len=max_len,
            dtype=dtype, enable_chunked_prefill=chunked,
            enable_prefix_caching=self.enable_prefix_caching is not False,
            block_size=self.block_size or 16,
            gpu_memory_utilization=self.gpu_memory_utilization or 0.9,
            async_scheduling=self.async_scheduling is not False,
            enforce_eager=bool(self.enforce_eager),
            enable_expert_parallel=bool(self.enable_expert_parallel))

    def with_defaults(self, defaults: "EngineArgs") -> "EngineArgs":
        """These flags, each left at ``None`` taking ``defaults``' value (a caller's own
        defaults)."""
        return dataclasses.replace(self, **{f.name: getattr(defaults, f.name)
                                            for f in dataclasses.fields(self)
                                            if getattr(self, f.name) is None})

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype] if self.dtype != "auto" else 2

    def cuda_graph_sizes(self) -> tuple[int, ...]:
        """The token counts vLLM captures graphs for (none with ``enforce_eager``); see
        ``vllm_sim/vllm_v1.json``'s ``cuda_graphs``. Needs resolved flags."""
        if self.enforce_eager:
            return ()
        largest = min(self.max_num_seqs * 2, 512, self.max_num_batched_tokens)
        sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, largest + 1, 16))
        return tuple(s for s in sizes if s <= largest)


def flag(name: str) -> str:
    """A field's command-line flag: ``max_num_seqs`` is ``--max-num-seqs``."""
    return "--" + name.replace("_", "-")


def padded_tokens(num_tokens: int, sizes: tuple[int, ...]) -> int:
    """The size a step of ``num_tokens`` runs at: the smallest captured size that holds it, or
    its own size when it is larger than every captured one (it runs eager)."""
    i = bisect.bisect_left(sizes, num_tokens)
    return sizes[i] if i < len(sizes) else num_tokens


__all__ = ["EngineArgs", "flag", "padded_tokens"]
