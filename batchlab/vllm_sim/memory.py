"""How vLLM sizes the KV cache on each GPU, in blocks, and the errors it gives when nothing fits.

The rules and their reasons: ``docs/predicting-a-deployment.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchlab.engine_args import EngineArgs
from batchlab.vllm_sim.vllm_data import ENGINE_DATA
from batchlab.shapes import ModelShape

GIB = 2**30
MEMORY = ENGINE_DATA["memory"]


@dataclass(frozen=True)
class MemoryPlan:
    """One GPU's memory in bytes, term by term, and the KV blocks every GPU of the replica holds."""

    visible: float
    usable: float
    weights: float
    activation: float
    non_torch: float
    kv_bytes: float
    block_size: int
    kv_bytes_per_block: int
    num_blocks: int

    @property
    def kv_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def lines(self) -> list[str]:
        g = GIB
        return [f"memory per GPU: {self.visible / g:.2f} GiB visible, "
                f"{self.usable / g:.2f} GiB usable; weights {self.weights / g:.2f} GiB, "
                f"activation peak {self.activation / g:.2f} GiB, "
                f"outside PyTorch {self.non_torch / g:.2f} GiB",
                f"KV cache: {self.kv_bytes / g:.2f} GiB per GPU = {self.num_blocks:,} blocks of "
                f"{self.block_size} tokens ({self.kv_tokens:,} tokens)"]


def activation_peak(model: ModelShape, args: EngineArgs, tensor_parallel: int) -> float:
    """The profiling pass's peak (see ``vllm_v1.json``): one layer's largest live tensors for the
    token budget, plus the sampler's fp32 logits and probabilities for ``max_num_seqs`` rows."""
    layer, tp = model.layer, tensor_parallel
    qkv = (layer.num_heads // tp + 2 * layer.kv_heads_per_gpu(tp)) * layer.head_dim
    per_token = qkv + 3 * layer.intermediate_size // tp + 2 * layer.hidden_size
    return (args.max_num_batched_tokens * per_token * args.dtype_bytes
            + args.max_num_seqs * model.vocab_size * 8)


def plan_memory(model: ModelShape, device_memory_bytes: float, args: EngineArgs,
                tensor_parallel: int) -> MemoryPlan:
    """The KV blocks of one replica of ``model`` over ``tensor_parallel`` GPUs (its args
    resolved)."""
    tp = tensor_parallel
    visible = device_memory_bytes * MEMORY["visible_fraction"]["value"]
    usable = visible * args.gpu_memory_utilization
    weights = model.num_params * args.dtype_bytes / tp
    activation = activation_peak(model, args, tp)
    non_torch = MEMORY["non_torch_GiB"]["tp1" if tp == 1 else "tp_many"] * GIB
    kv_bytes = usable - weights - activation - non_torch
    if kv_bytes <= 0:
        need = next((t for t in (1, 2, 4, 8) if model.num_params * args.dtype_bytes / t + activation
                     + non_torch < usable and t > tp), None)
        raise ValueError(f"weights={weights / GIB:.1f} GiB per GPU; must fit in "
                         f"gpu_memory_utilization x memory = {usable / GIB:.1f} GiB with "
                         f"{(activation + non_torch) / GIB:.1f} GiB for activations "
                         f"and CUDA ({model.name} at tensor_parallel={tp}"
                         + (f"; --tensor-parallel-size {need} fits" if need else "") + ")")
    per_block = args.block_size * model.kv_bytes_per_token(args.dtype_bytes, tp)
    plan = MemoryPlan(visible, usable, weights, activation, non_torch, kv_bytes, args.block_size,
                      per_block, int(kv_bytes // per_block))
    need_blocks = -(-args.max_model_len // args.block_size)
    if plan.num_blocks < need_blocks:
        raise ValueError(f"max_model_len={args.max_model_len}; must fit in the KV cache: "
                         f"one sequence of it needs {need_blocks * per_block / GIB:.2f} GiB "
                         f"per GPU, the cache has {kv_bytes / GIB:.2f} GiB "
                         f"({plan.kv_tokens:,} tokens); "
                         f"the longest context that fits is {plan.kv_tokens:,} "
                         "(raise --gpu-memory-utilization or lower --max-model-len)")
    return plan


__all__ = ["GIB", "MemoryPlan", "activation_peak", "plan_memory"]
