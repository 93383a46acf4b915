"""Models' shapes as data: the sizes that decide a decoder's weights, its work per token, its KV
cache.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from batchlab.checks import check_bool, check_choice, check_int, check_number, fail
from batchlab.kv_blocks import DEFAULT_BLOCK_SIZE, blocks_for

SHAPES_PATH = Path(__file__).resolve().parent / "shapes.json"   # package data
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1}
SMALL_OPS_PER_LAYER = 5   # input norm, post-attention norm, rope, activation, residual add
# Hugging Face architectures that are dense Llama-style decoders (Qwen2's q/k/v biases are a few
# thousand parameters a layer: left out of the counts here).
DENSE_DECODERS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
MOE_DECODERS = ("MixtralForCausalLM", "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM")


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of KV cache one token needs: a key and a value per layer and KV head."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


@dataclass(frozen=True)
class LayerShape:
    """One decoder layer's sizes (a gated MLP is Llama's: gate and up projections, then down)."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    gated_mlp: bool = True

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size"):
            check_int(name, getattr(self, name))
        check_bool("gated_mlp", self.gated_mlp)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads}; must be a multiple of "
                             f"num_kv_heads={self.num_kv_heads} (grouped-query attention)")

    def __str__(self) -> str:
        return (f"hidden {self.hidden_size}, {self.num_heads} heads of {self.head_dim} "
                f"({self.num_kv_heads} KV), "
                f"MLP {self.intermediate_size}{' gated' if self.gated_mlp else ''}")

    def check_tensor_parallel(self, tensor_parallel: int) -> None:
        """``tensor_parallel`` GPUs can split this layer: it divides the heads and the MLP, and it
        divides the KV heads or is a multiple of them (vLLM then replicates each KV head)."""
        check_int("tensor_parallel", tensor_parallel)
        sizes = {"num_heads": self.num_heads, "intermediate_size": self.intermediate_size}
        kv = self.num_kv_heads
        if (any(size % tensor_parallel for size in sizes.values())
                or (kv % tensor_parallel and tensor_parallel % kv)):
            raise ValueError(f"tensor_parallel={tensor_parallel}; must divide "
                             + ", ".join(f"{k}={v}" for k, v in sizes.items())
                             + f", and divide num_kv_heads={kv} or be a multiple of it")

    def kv_heads_per_gpu(self, tensor_parallel: int = 1) -> int:
        """KV heads each of ``tensor_parallel`` GPUs holds: a share, or one replicated head."""
        return max(1, self.num_kv_heads // tensor_parallel)

    def projections(self, tensor_parallel: int = 1) -> tuple[tuple[int, int], ...]:
        """(input, output) sizes of the four matrix multiplies one GPU runs: qkv, o, up, down."""
        self.check_tensor_parallel(tensor_parallel)
        h, tp = self.hidden_size, tensor_parallel
        q, kv = self.num_heads * self.head_dim // tp, self.kv_heads_per_gpu(tp) * self.head_dim
        inter = self.intermediate_size // tp
        up = 2 * inter if self.gated_mlp else inter
        return (h, q + 2 * kv), (q, h), (h, up), (inter, h)

    @property
    def matmul_params(self) -> int:
        """Weights of the layer's four matrix multiplies."""
        return sum(k * n for k, n in self.projections())

    def small_op_elements(self, tensor_parallel: int = 1) -> int:
        """Elements read and written per token by the small operators on one GPU: two RMS norms
        (read and write the hidden state), rope (q and k in place), the activation (gate and up in,
        one out; plain MLP: one in, one out) and the residual add (two in, one out)."""
        self.check_tensor_parallel(tensor_parallel)
        h, tp = self.hidden_size, tensor_parallel
        q, kv = self.num_heads * self.head_dim // tp, self.kv_heads_per_gpu(tp) * self.head_dim
        act = (3 if self.gated_mlp else 2) * self.intermediate_size // tp
        return 2 * (2 * h) + 2 * (q + kv) + act + 3 * h


@dataclass(frozen=True)
class MoEShape:
    """A mixture-of-experts MLP: ``num_experts`` gated experts of ``intermediate_size``, each token
    routed to ``experts_per_token`` of them (Mixtral's and Qwen-MoE's layout, no shared expert)."""

    num_experts: int
    experts_per_token: int
    intermediate_size: int

    def __post_init__(self) -> None:
        for name in ("num_experts", "experts_per_token", "intermediate_size"):
            check_int(name, getattr(self, name))
        if self.experts_per_token > self.num_experts:
            fail("experts_per_token", self.experts_per_token, f"<= num_experts={self.num_experts}")

    @property
    def params_per_layer(self) -> int:
        """Every expert's gate, up and down weights, per unit of the hidden size (the layer holds
        ``hidden_size`` times this, plus a router of ``hidden_size x num_experts``)."""
        return self.num_experts * 3 * self.intermediate_size


@dataclass(frozen=True)
class ModelShape:
    """A whole decoder: ``num_layers`` layers, the LM head, the embedding, the element type it is
    served in (``dtype``), and where the numbers come from (``source``)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool
    source: str
    dtype: str = "bfloat16"
    max_model_len: int | None = None    # the context it was trained for (max_position_embeddings)
    moe: MoEShape | None = None         # experts in place of the dense MLP

    def __post_init__(self) -> None:
        hint = f"model shape {self.name!r}"
        check_int("num_layers", self.num_layers, hint=hint)
        check_int("max_model_len", self.max_model_len, allow_none=True, hint=hint)
        check_int("vocab_size", self.vocab_size, hint=hint)
        check_bool("tie_embeddings", self.tie_embeddings)
        check_choice("dtype", self.dtype, sorted(DTYPE_BYTES), hint=hint)
        object.__setattr__(self, "_layer",
                           LayerShape(self.hidden_size, self.num_heads, self.num_kv_heads,
                                                      self.head_dim, self.intermediate_size))
        if not isinstance(self.source, str) or not self.source:
            fail("source", self.source, "a non-empty string",
                 f"{hint}: say where its numbers come from")

    @property
    def layer(self) -> LayerShape:
        return self._layer

    # --- weights and work -----------------------------------------------------------------------
    @property
    def matmul_params(self) -> int:
        """Weights of every matrix multiply: per layer q, k, v, o and the MLP's three (every
        expert's, with experts, and the router); the LM head. (The embedding lookup reads a few
        rows only; tied, the LM head *is* the embedding table.)"""
        per_layer = self.layer.matmul_params
        if self.moe is not None:
            dense_mlp = ((3 if self.layer.gated_mlp else 2) * self.hidden_size
                         * self.intermediate_size)
            per_layer += (self.hidden_size * (self.moe.params_per_layer + self.moe.num_experts)
                          - dense_mlp)
        return self.num_layers * per_layer + self.hidden_size * self.vocab_size

    @property
    def num_params(self) -> int:
        """All parameters as usually counted (adds the embedding table when not tied; norms)."""
        norms = (2 * self.num_layers + 1) * self.hidden_size
        embed = 0 if self.tie_embeddings else self.vocab_size * self.hidden_size
        return self.matmul_params + embed + norms

    def weight_bytes(self, dtype_bytes: int) -> int:
        return self.matmul_params * dtype_bytes

    @property
    def attention_flops_per_pair(self) -> int:
        """q·k and p·v for one query-key pair: 2 multiply-adds of ``head_dim`` per query head
        per layer."""
        return 4 * self.num_layers * self.num_heads * self.head_dim

    # --- the KV cache ---------------------------------------------------------------------------
    def kv_bytes_per_token(self, dtype_bytes: int, tensor_parallel: int = 1) -> int:
        """A key and a value per KV head per layer, of ``dtype_bytes`` each element; with
        ``tensor_parallel``, on each GPU (its share of the KV heads, or one replicated head)."""
        heads = (self.num_kv_heads if tensor_parallel == 1
                 else self.layer.kv_heads_per_gpu(tensor_parallel))
        return kv_bytes_per_token(self.num_layers, heads, self.head_dim, dtype_bytes)

    @property
    def bytes_per_token(self) -> int:
        """KV bytes per token in the model's own ``dtype``."""
        return self.kv_bytes_per_token(DTYPE_BYTES[self.dtype])

    def with_dtype(self, dtype: str) -> "ModelShape":
        """The same model served in another element type."""
        return dataclasses.replace(self, dtype=dtype)

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

    # --- from a model's own configuration -------------------------------------------------------
    @classmethod
    def from_llama_config(cls, config, name: str, source: str,
                          dtype: str = "float32") -> "ModelShape":
        """From ``batchlab.model.llama.LlamaConfig`` (e.g. ``weights.config`` of the loaded
        model)."""
        return cls(name, config.num_layers, config.hidden_size, config.num_heads,
                   config.num_kv_heads,
                   config.head_dim, config.intermediate_size, config.vocab_size, True, source,
                   dtype, config.max_position)

    @classmethod
    def from_config_json(cls, path: str | Path, name: str | None = None) -> "ModelShape":
        """From a Hugging Face ``config.json`` of a dense Llama-style decoder (see
        ``DENSE_DECODERS``)."""
        path = Path(path)
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"config={str(path)!r}: not a readable config.json ({e})") from None
        return cls.from_config(config, name or path.parent.name or path.stem,
                               source=f"config.json at {path}")

    @classmethod
    def from_config(cls, config: dict, name: str, source: str) -> "ModelShape":
        """From the fields of a Hugging Face config (a ``config.json`` read as a dict)."""
        architectures = config.get("architectures") or [config.get("model_type", "unknown")]
        allowed = list(DENSE_DECODERS + MOE_DECODERS)
        if architectures[0] not in allowed:
            fail("architectures", architectures, f"one of {allowed}",
                 f"{name}: not a Llama-style decoder "
                 "(dense, or Mixtral/Qwen-MoE experts); "
                 "MLA and other attention variants are not priced")
        moe = moe_from_config(config, name) if architectures[0] in MOE_DECODERS else None
        missing = [k for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                               "intermediate_size", "vocab_size") if k not in config]
        if missing:
            raise ValueError(f"{name}: config lacks {missing}; "
                             "a decoder's config.json names them all")
        heads = config["num_attention_heads"]
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
        return cls(name, config["num_hidden_layers"], config["hidden_size"], heads,
                   config.get("num_key_value_heads") or heads,
                   config.get("head_dim") or config["hidden_size"] // heads,
                   config["intermediate_size"],
                   config["vocab_size"], bool(config.get("tie_word_embeddings", False)), source,
                   dtype if dtype in DTYPE_BYTES else "bfloat16",
                   config.get("max_position_embeddings"), moe)


def moe_from_config(config: dict, name: str) -> MoEShape:
    """The experts of a Mixtral- or Qwen-MoE-style config; a shared expert, or experts on only
    some layers, are refused by name (not priced)."""
    for key in ("shared_expert_intermediate_size", "n_shared_experts"):
        if config.get(key):
            fail(key, config[key], "0 or absent", f"{name}: shared experts are not priced")
    if config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1:
        fail("decoder_sparse_step", config.get("decoder_sparse_step"), "1 (experts on every layer)",
             name)
    experts = config.get("num_local_experts") or config.get("num_experts")
    per_token = config.get("num_experts_per_tok")
    inter = config.get("moe_intermediate_size") or config.get("intermediate_size")
    if not (experts and per_token and inter):
        raise ValueError(f"{name}: an MoE config names num_local_experts (or num_experts), "
                         "num_experts_per_tok and the experts' intermediate size")
    return MoEShape(int(experts), int(per_token), int(inter))


def load_model_shapes(path: str | Path = SHAPES_PATH) -> dict[str, ModelShape]:
    """Every shape in ``batchlab/shapes.json`` (or ``path``), by name."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return {name: ModelShape(name=name,
                             **{**fields,
                                "moe": MoEShape(**fields["moe"]) if "moe" in fields else None})
            for name, fields in data["models"].items()}


MODEL_SHAPES: dict[str, ModelShape] = load_model_shapes()


def model_shape(name: str) -> ModelShape:
    """The shape called ``name`` in ``MODEL_SHAPES``, or read from ``name`` if it is the path of a
    ``config.json``."""
    if isinstance(name, (str, Path)) and str(name).endswith(".json"):
        return ModelShape.from_config_json(name)
    check_choice("shape", name, sorted(MODEL_SHAPES),
                 hint="a name in batchlab/shapes.json, or a config.json path")
    return MODEL_SHAPES[name]


__all__ = ["DENSE_DECODERS", "DTYPE_BYTES", "MODEL_SHAPES", "SHAPES_PATH", "SMALL_OPS_PER_LAYER",
           "LayerShape", "ModelShape", "kv_bytes_per_token", "load_model_shapes", "model_shape"]
