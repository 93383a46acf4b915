"""Models' KV-cache shapes as data, and what a memory budget holds for each.

One token's keys and values take ``2 x num_layers x num_kv_heads x head_dim x bytes per element``
bytes (a key and a value per layer and key/value head). A budget of ``memory_bytes`` then holds
``memory_bytes // bytes_per_token`` token positions, or that many over ``block_size`` whole
blocks, and at a given context length, that many sequences at once. The shapes are read from
``batchlab/model/model_shapes.json``, where each entry says where its numbers come from.

Worked example (Llama-3-8B in bf16): 2 x 32 x 8 x 128 x 2 = 131,072 bytes = 128 KiB per token, so
a 1 GiB budget holds 8,192 tokens: 4 sequences of 2,048 tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from batchlab.checks import check_choice, check_int, check_number, fail
from batchlab.kv_blocks import DEFAULT_BLOCK_SIZE, blocks_for

SHAPES_PATH = Path(__file__).resolve().parent / "model_shapes.json"   # package data
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1}


@dataclass(frozen=True)
class ModelShape:
    """What sizes a model's KV cache: layers, KV heads, head size, the element type, and a source."""

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    source: str

    def __post_init__(self) -> None:
        for field in ("num_layers", "num_kv_heads", "head_dim"):
            check_int(field, getattr(self, field), hint=f"model shape {self.name!r}")
        check_choice("dtype", self.dtype, sorted(DTYPE_BYTES), hint=f"model shape {self.name!r}")
        if not self.source:
            fail("source", self.source, "a non-empty string",
                 f"model shape {self.name!r}: say where its numbers come from")

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * DTYPE_BYTES[self.dtype]

    def with_dtype(self, dtype: str) -> "ModelShape":
        """The same model with its cache stored in another element type."""
        return ModelShape(self.name, self.num_layers, self.num_kv_heads, self.head_dim, dtype, self.source)

    def kv_tokens(self, memory_bytes: float) -> int:
        """Token positions a budget of ``memory_bytes`` holds."""
        check_number("memory_bytes", memory_bytes)
        return int(memory_bytes // self.bytes_per_token)

    def num_blocks(self, memory_bytes: float, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
        """Whole blocks of ``block_size`` tokens a budget holds."""
        check_int("block_size", block_size)
        return self.kv_tokens(memory_bytes) // block_size

    def max_concurrency(self, memory_bytes: float, context_tokens: int,
                        block_size: int = DEFAULT_BLOCK_SIZE) -> int:
        """How many sequences of ``context_tokens`` fit at once in paged blocks."""
        check_int("context_tokens", context_tokens)
        return self.num_blocks(memory_bytes, block_size) // blocks_for(context_tokens, block_size)


def load_model_shapes(path: str | Path = SHAPES_PATH) -> dict[str, ModelShape]:
    """Every shape in ``batchlab/model/model_shapes.json`` (or ``path``), by name."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return {name: ModelShape(name=name, **fields) for name, fields in data["models"].items()}


def model_shape(name: str) -> ModelShape:
    """The shape called ``name`` in ``batchlab/model/model_shapes.json``."""
    shapes = load_model_shapes()
    check_choice("name", name, sorted(shapes), hint="a model shape in model_shapes.json")
    return shapes[name]
