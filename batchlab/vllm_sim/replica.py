"""One vLLM V1 replica on simulated GPUs, built as ``vllm serve`` would build it.

The rules and their reasons: ``docs/predicting-a-deployment.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from batchlab.sim import SimBackend
from batchlab.steptime.collectives import all_reduce_model
from batchlab.steptime.device_presets import DevicePreset, load_device_presets
from batchlab.steptime.grounded_step import GroundedStep
from batchlab.steptime.kernels import KernelModel
from batchlab.steptime.measured_kernels import SYSTEMS, KernelTables
from batchlab.steptime.measured_step import MeasuredStep
from batchlab.checks import check_choice, check_instance, check_int, fail
from batchlab.engine import Engine
from batchlab.schedulers import ContinuousBatcher
from batchlab.schedulers.continuous import batcher_for
from batchlab.shapes import ModelShape, model_shape
from batchlab.vllm_sim.async_scheduling import AsyncScheduledBatcher
from batchlab.engine_args import EngineArgs
from batchlab.vllm_sim.memory import GIB, MemoryPlan, plan_memory
from batchlab.vllm_sim.step_model import VllmStepModel


@dataclass(frozen=True)
class VllmReplica:
    """``model`` (a ``MODEL_SHAPES`` name, a ``config.json`` path or a ``ModelShape``) served by
    one vLLM engine over ``tensor_parallel_size`` GPUs of preset ``gpu``."""

    model: str | ModelShape
    gpu: str
    tensor_parallel_size: int = 1
    args: EngineArgs = field(default_factory=EngineArgs)
    vllm_version: str | None = None      # the measured kernels' vLLM version (None: the newest)

    def __post_init__(self) -> None:
        try:
            shape = self.model if isinstance(self.model, ModelShape) else model_shape(self.model)
        except ValueError as err:
            raise ValueError(f"model: {err}") from None
        presets = load_device_presets()
        check_choice("gpu", self.gpu, sorted(presets),
                     hint="--gpu, a preset of batchlab/steptime/device_presets.json")
        check_int("tensor_parallel_size", self.tensor_parallel_size, hint="--tensor-parallel-size")
        check_instance("args", self.args, EngineArgs, "an EngineArgs")
        if self.vllm_version is not None and not re.fullmatch(r"\d+\.\d+(\.\d+)?",
                                                              str(self.vllm_version)):
            fail("vllm_version", self.vllm_version, "a version such as 0.24.0",
                 hint="--vllm-version")
        shape.layer.check_tensor_parallel(self.tensor_parallel_size)
        preset = presets[self.gpu]
        memory = device_memory_bytes(preset)
        args = self.args.resolved(preset.name, memory / GIB, shape)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "preset", preset)
        object.__setattr__(self, "resolved_args", args)
        object.__setattr__(self, "memory",
                           plan_memory(shape, memory, args, self.tensor_parallel_size))
        object.__setattr__(self, "step_model", self._step_model())

    # Set in __post_init__: the checked shape and preset, vLLM's flags with its defaults for this
    # GPU filled in, the KV plan of each GPU, and the step time.
    shape: ModelShape = field(init=False, repr=False, compare=False)
    preset: DevicePreset = field(init=False, repr=False, compare=False)
    resolved_args: EngineArgs = field(init=False, repr=False, compare=False)
    memory: MemoryPlan = field(init=False, repr=False, compare=False)
    step_model: VllmStepModel = field(init=False, repr=False, compare=False)

    def _step_model(self) -> VllmStepModel:
        """Measured vLLM kernels where AIConfigurator measured this GPU; else the preset's kernel
        model fitted to 2024 profiles (``GroundedStep``), which prices dense models only."""
        preset, tp, args, shape = (self.preset, self.tensor_parallel_size, self.resolved_args,
                                   self.shape)
        if preset.kernels is None:
            raise ValueError(f"gpu={self.gpu!r}; must have fitted kernels to simulate vLLM on it")
        kernels = KernelModel(preset.memory_bandwidth_Bps, preset.peak_flops, args.dtype_bytes,
                              preset.kernels, preset.num_sms)
        sizes = args.cuda_graph_sizes()
        if self.gpu in SYSTEMS:
            tables = KernelTables.load(self.gpu, self.vllm_version)
            gpu = MeasuredStep(shape, tables, kernels, tp, max(sizes, default=0),
                               args.enable_expert_parallel)
        else:
            if (shape.moe is not None or args.enable_expert_parallel
                    or self.vllm_version is not None):
                fail("gpu", self.gpu, f"one of {sorted(SYSTEMS)}",
                     "experts, expert parallelism and "
                     "--vllm-version need measured vLLM kernels")
            all_reduce = all_reduce_model(preset.name, tp) if tp > 1 else None
            gpu = GroundedStep(shape, kernels, tp, all_reduce)
        return VllmStepModel(gpu, sizes, args.async_scheduling)

    @property
    def kv_bytes_per_token(self) -> int:
        """A token's KV bytes over the whole replica (every layer, every GPU's heads)."""
        return self.shape.kv_bytes_per_token(self.resolved_args.dtype_bytes)

    @property
    def kernel_source(self) -> str:
        """Where the step's kernel times come from, in words."""
        gpu = self.step_model.gpu
        if isinstance(gpu, MeasuredStep):
            fit = gpu.attention_fit
            return (f"kernels: {gpu.tables.describe(self.vllm_version)}; "
                    f"attention fitted to the measured kernels of "
                    f"{fit.measured_heads['prefill']} / {fit.measured_heads['decode']} heads "
                    f"(prefill / decode, median error {fit.median_error['prefill']:.0%} / "
                    f"{fit.median_error['decode']:.0%})")
        return (f"kernels: ROOFLINE-BASED ESTIMATE for {self.gpu} (no measured vLLM kernels: "
                "the preset's kernel model fitted to 2024 profiles, NCCL all-reduces)")

    def backend(self, noise: float = 0.0, seed: int = 0) -> SimBackend:
        """The replica's simulated GPUs: its step time and its KV blocks."""
        return SimBackend.for_args(self.step_model, self.memory.kv_tokens, self.resolved_args,
                                   noise=noise, seed=seed)

    def scheduler(self) -> ContinuousBatcher:
        """vLLM's scheduler with this replica's budgets (async scheduling unless turned off)."""
        return scheduler_for(self.resolved_args)

    def engine(self, index: int = 0) -> Engine:
        """One replica's engine on the virtual clock (``index``: its place in a cluster, unused)."""
        return simulated_engine(self.scheduler(), self.backend())

    def describe(self) -> list[str]:
        """The flags as ``vllm serve`` would be given them, the memory plan and the kernels'
        source."""
        f = self.resolved_args
        on_by_default = ("enable_chunked_prefill", "enable_prefix_caching", "async_scheduling")
        shown = replace(f, dtype="auto",
                        **{name: None for name in on_by_default if getattr(f, name)})
        return [f"flags: {' '.join(shown.cli_args())}", *self.memory.lines(),
                *self._memory_caveat(), self.kernel_source]

    def _memory_caveat(self) -> list[str]:
        if self.gpu == "H100":
            return []
        return [f"memory: the H100's visible share of the datasheet figure assumed for the "
                f"{self.gpu} (no log of its own): read the KV cache as an upper bound"]


def device_memory_bytes(preset: DevicePreset) -> float:
    """A datasheet's GB are the card's GiB (80 GB HBM is 80 GiB)."""
    return preset.memory_bytes / 1e9 * GIB


def scheduler_for(args: EngineArgs) -> ContinuousBatcher:
    """vLLM V1's scheduler under ``args``: its budgets, and the async-scheduling variant when
    ``args.async_scheduling`` is on (the one builder of it from vLLM's flags)."""
    return batcher_for(args, AsyncScheduledBatcher if args.async_scheduling else ContinuousBatcher)


def simulated_engine(scheduler: ContinuousBatcher, backend: SimBackend,
                     fast_decode_runs: bool = True) -> Engine:
    """An engine on the virtual clock, an async scheduler let see its latest step (it holds back
    that step's arrivals)."""
    engine = Engine(scheduler, backend, fast_decode_runs=fast_decode_runs)
    if isinstance(scheduler, AsyncScheduledBatcher):
        scheduler.last_step = lambda: engine.steps[-1] if engine.steps else None
    return engine


__all__ = ["VllmReplica", "device_memory_bytes", "scheduler_for", "simulated_engine"]
