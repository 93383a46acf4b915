"""vLLM's serving flags as one checked config, with vLLM's defaults resolved for a device.

``EngineFlags`` holds the flags by vLLM's names (``max_num_seqs`` is ``--max-num-seqs``, ...).
A field left at ``None`` takes vLLM V1's default for the device, as ``vllm serve`` sets it
(``vllm_v1.json``'s ``defaults``, read from vLLM's ``EngineArgs.get_batch_defaults``);
``resolved(device, model)`` returns the flags with every default filled in.
``cuda_graph_sizes`` gives the batch sizes vLLM captures CUDA graphs for, and ``padded_tokens``
the size a step runs at (the next captured size up, or its own size when none covers it).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from batchlab.checks import check_bool, check_choice, check_fraction, check_int, fail
from batchlab.kv_blocks import check_block_size
from batchlab.shapes import DTYPE_BYTES, ModelShape

ENGINE_DATA = json.loads((Path(__file__).resolve().parent / "vllm_v1.json").read_text(encoding="utf-8"))
LARGE_DEVICE_GIB = 70          # vLLM's larger defaults: at least 70 GiB and not an A100
DTYPES = ("auto", "float16", "bfloat16")


@dataclass(frozen=True)
class EngineFlags:
    """vLLM V1's flags that decide a deployment's speed and memory (``None``: vLLM's default)."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    dtype: str = "auto"
    enforce_eager: bool = False
    async_scheduling: bool = True
    enable_expert_parallel: bool = False

    def __post_init__(self) -> None:
        check_int("max_num_seqs", self.max_num_seqs, allow_none=True, hint="--max-num-seqs")
        check_int("max_num_batched_tokens", self.max_num_batched_tokens, allow_none=True,
                  hint="--max-num-batched-tokens")
        for name in ("enable_chunked_prefill", "enable_prefix_caching", "enforce_eager", "async_scheduling",
                     "enable_expert_parallel"):
            check_bool(name, getattr(self, name))
        check_block_size(self.block_size)
        check_fraction("gpu_memory_utilization", self.gpu_memory_utilization, hint="--gpu-memory-utilization")
        check_int("max_model_len", self.max_model_len, allow_none=True, hint="--max-model-len")
        check_choice("dtype", self.dtype, DTYPES, hint="--dtype")

    def resolved(self, device_name: str, device_memory_gib: float, model: ModelShape) -> "EngineFlags":
        """These flags with vLLM's defaults for ``device`` and ``model`` filled in, and checked
        together (vLLM refuses a token budget under the context without chunked prefill)."""
        large = device_memory_gib >= LARGE_DEVICE_GIB and "a100" not in device_name.lower()
        seqs = self.max_num_seqs or (1024 if large else 256)
        max_len = self.max_model_len or model.max_model_len
        if max_len is None:
            fail("max_model_len", None, "an int >= 1", f"{model.name}'s config gives no "
                 "max_position_embeddings: pass --max-model-len")
        if model.max_model_len is not None and max_len > model.max_model_len:
            fail("max_model_len", max_len, f"<= {model.max_model_len}",
                 f"{model.name}'s max_position_embeddings; vLLM refuses a longer context")
        budget = self.max_num_batched_tokens or ((8192 if large else 2048) if self.enable_chunked_prefill
                                                else max(max_len, 2048))
        if not self.enable_chunked_prefill and budget < max_len:
            fail("max_num_batched_tokens", budget, f">= max_model_len={max_len}",
                 "without chunked prefill a whole prompt runs in one step")
        if budget < seqs and self.max_num_batched_tokens is not None and self.max_num_seqs is not None:
            fail("max_num_batched_tokens", budget, f">= max_num_seqs={seqs}", "vLLM's own rule")
        dtype = model.dtype if self.dtype == "auto" else self.dtype
        if dtype not in ("float16", "bfloat16"):
            dtype = "bfloat16"   # a float32 checkpoint is served in bf16 by vLLM's "auto" on a GPU
        return dataclasses.replace(self, max_num_seqs=seqs, max_num_batched_tokens=budget,
                                   max_model_len=max_len, dtype=dtype)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype] if self.dtype != "auto" else 2

    def cuda_graph_sizes(self) -> tuple[int, ...]:
        """The token counts vLLM captures graphs for (none with ``enforce_eager``); see
        ``vllm_v1.json``'s ``cuda_graphs``. Needs resolved flags."""
        if self.enforce_eager:
            return ()
        largest = min(self.max_num_seqs * 2, 512, self.max_num_batched_tokens)
        sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, largest + 1, 16))
        return tuple(s for s in sizes if s <= largest)


def padded_tokens(num_tokens: int, sizes: tuple[int, ...]) -> int:
    """The size a step of ``num_tokens`` runs at: the smallest captured size that holds it, or
    its own size when it is larger than every captured one (it runs eager)."""
    i = bisect.bisect_left(sizes, num_tokens)
    return sizes[i] if i < len(sizes) else num_tokens


__all__ = ["ENGINE_DATA", "EngineFlags", "padded_tokens"]
