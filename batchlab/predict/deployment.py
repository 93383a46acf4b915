"""A vLLM deployment (model, GPU, tensor and data parallelism, flags) and its predicted serving.

``Deployment`` checks the whole setup the way vLLM would refuse it (unknown model or GPU, a
tensor-parallel degree that does not divide the heads, weights that do not fit, a KV cache too
small for one ``max_model_len`` sequence), and builds each replica: ``tensor_parallel_size``
GPUs running ``VllmStepModel`` (measured kernels, all-reduces, CUDA-graph padding, the engine's
CPU work) with the KV blocks ``plan_memory`` derives, scheduled by ``ContinuousBatcher`` with
vLLM's budgets. ``predict(deployment, traffic)`` serves the traffic on one replica, or on
``data_parallel_size`` replicas behind a ``batchlab.cluster`` router, and returns a ``Prediction``.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from batchlab.backends import SimBackend
from batchlab.backends.collectives import all_reduce_model
from batchlab.backends.device_presets import DevicePreset, load_device_presets
from batchlab.backends.grounded_step import GroundedStep
from batchlab.backends.kernels import KernelModel
from batchlab.backends.measured_kernels import SYSTEMS, KernelTables
from batchlab.backends.measured_step import MeasuredStep
from batchlab.checks import check_choice, check_instance, check_int, fail
from batchlab.cluster import Cluster, ClusterConfig, DisaggregatedCluster, DisaggregatedConfig
from batchlab.cluster.policies import ROUTING_POLICIES
from batchlab.engine import Engine
from batchlab.predict.async_scheduling import AsyncScheduledBatcher
from batchlab.predict.engine_flags import EngineFlags
from batchlab.predict.memory import GIB, MemoryPlan, plan_memory
from batchlab.predict.report import Prediction
from batchlab.predict.step_model import VllmStepModel
from batchlab.predict.traffic import Traffic
from batchlab.schedulers import ContinuousBatcher
from batchlab.shapes import ModelShape, model_shape


@dataclass(frozen=True)
class Deployment:
    """``data_parallel_size`` replicas of ``model`` (a ``MODEL_SHAPES`` name, a ``config.json``
    path or a ``ModelShape``), each over ``tensor_parallel_size`` GPUs of preset ``gpu``."""

    model: str | ModelShape
    gpu: str
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    flags: EngineFlags = field(default_factory=EngineFlags)
    routing: str = "least_outstanding"
    vllm_version: str | None = None      # the measured kernels' vLLM version (None: the newest)

    def __post_init__(self) -> None:
        try:
            shape = self.model if isinstance(self.model, ModelShape) else model_shape(self.model)
        except ValueError as err:
            raise ValueError(f"model: {err}") from None
        presets = load_device_presets()
        check_choice("gpu", self.gpu, sorted(presets), hint="--gpu, a preset of batchlab/backends/device_presets.json")
        check_int("tensor_parallel_size", self.tensor_parallel_size, hint="--tensor-parallel-size")
        check_int("data_parallel_size", self.data_parallel_size, hint="--data-parallel-size")
        check_instance("flags", self.flags, EngineFlags, "an EngineFlags")
        check_choice("routing", self.routing, ROUTING_POLICIES)
        if self.vllm_version is not None and not re.fullmatch(r"\d+\.\d+(\.\d+)?", str(self.vllm_version)):
            fail("vllm_version", self.vllm_version, "a version such as 0.24.0", hint="--vllm-version")
        shape.layer.check_tensor_parallel(self.tensor_parallel_size)
        preset = presets[self.gpu]
        flags = self.flags.resolved(preset.name, self.device_memory_bytes(preset) / GIB, shape)
        object.__setattr__(self, "_shape", shape)
        object.__setattr__(self, "_preset", preset)
        object.__setattr__(self, "_flags", flags)
        object.__setattr__(self, "_memory", plan_memory(shape, self.device_memory_bytes(preset), flags,
                                                        self.tensor_parallel_size))
        object.__setattr__(self, "_step", self._step_model())

    @staticmethod
    def device_memory_bytes(preset: DevicePreset) -> float:
        """A datasheet's GB are the card's GiB (80 GB HBM is 80 GiB)."""
        return preset.memory_bytes / 1e9 * GIB

    # --- what it is built from -----------------------------------------------------------------
    @property
    def shape(self) -> ModelShape:
        return self._shape

    @property
    def resolved_flags(self) -> EngineFlags:
        return self._flags

    @property
    def memory(self) -> MemoryPlan:
        return self._memory

    @property
    def step_model(self) -> VllmStepModel:
        return self._step

    @property
    def num_gpus(self) -> int:
        return self.tensor_parallel_size * self.data_parallel_size

    def _step_model(self) -> VllmStepModel:
        """Measured vLLM kernels where AIConfigurator measured this GPU; else the preset's kernel
        model fitted to 2024 profiles (``GroundedStep``), which prices dense models only."""
        preset, tp, flags, shape = self._preset, self.tensor_parallel_size, self._flags, self._shape
        if preset.kernels is None:
            raise ValueError(f"gpu={self.gpu!r}; must have fitted kernels to predict a deployment")
        kernels = KernelModel(preset.memory_bandwidth_Bps, preset.peak_flops, flags.dtype_bytes, preset.kernels,
                              preset.num_sms)
        sizes = flags.cuda_graph_sizes()
        if self.gpu in SYSTEMS:
            tables = KernelTables.load(self.gpu, self.vllm_version)
            gpu = MeasuredStep(shape, tables, kernels, tp, max(sizes, default=0), flags.enable_expert_parallel)
        else:
            if shape.moe is not None or flags.enable_expert_parallel or self.vllm_version is not None:
                fail("gpu", self.gpu, f"one of {sorted(SYSTEMS)}", "experts, expert parallelism and "
                     "--vllm-version need measured vLLM kernels")
            all_reduce = all_reduce_model(preset.name, tp) if tp > 1 else None
            gpu = GroundedStep(shape, kernels, tp, all_reduce)
        return VllmStepModel(gpu, sizes, flags.async_scheduling)

    @property
    def kernel_source(self) -> str:
        """Where the step's kernel times come from, in words."""
        gpu = self._step.gpu
        if isinstance(gpu, MeasuredStep):
            fit = gpu.attention_fit
            return (f"kernels: {gpu.tables.describe(self.vllm_version)}; attention fitted to the measured kernels of "
                    f"{fit.measured_heads['prefill']} / {fit.measured_heads['decode']} heads (prefill / decode, "
                    f"median error {fit.median_error['prefill']:.0%} / {fit.median_error['decode']:.0%})")
        return (f"kernels: ROOFLINE-BASED ESTIMATE for {self.gpu} (no measured vLLM kernels: the preset's kernel "
                "model fitted to 2024 profiles, NCCL all-reduces)")

    def engine(self, index: int = 0) -> Engine:
        """One replica's engine on the virtual clock."""
        f = self._flags
        backend = SimBackend(self._step, self._memory.kv_tokens, f.max_model_len, block_size=f.block_size,
                             enable_prefix_caching=f.enable_prefix_caching)
        if not f.async_scheduling:
            return Engine(ContinuousBatcher(f.max_num_seqs, f.max_num_batched_tokens, f.enable_chunked_prefill), backend)
        scheduler = AsyncScheduledBatcher(f.max_num_seqs, f.max_num_batched_tokens, f.enable_chunked_prefill)
        engine = Engine(scheduler, backend)
        scheduler.last_step = lambda: engine.steps[-1] if engine.steps else None
        return engine

    def describe(self) -> list[str]:
        f = self._flags
        return [f"{self._shape.name} on {self.data_parallel_size} x {self.tensor_parallel_size} {self.gpu} "
                f"({self.num_gpus} GPUs; tensor parallel {self.tensor_parallel_size}, {self.data_parallel_size} "
                f"replica{'s' if self.data_parallel_size > 1 else ''}"
                + (f" behind a {self.routing} router" if self.data_parallel_size > 1 else "") + f"), {f.dtype}",
                f"flags: --max-num-seqs {f.max_num_seqs} --max-num-batched-tokens {f.max_num_batched_tokens} "
                f"--block-size {f.block_size} --gpu-memory-utilization {f.gpu_memory_utilization} --max-model-len "
                f"{f.max_model_len}" + ("" if f.enable_chunked_prefill else " --no-enable-chunked-prefill")
                + ("" if f.enable_prefix_caching else " --no-enable-prefix-caching")
                + (" --enforce-eager" if f.enforce_eager else "") + ("" if f.async_scheduling else " --no-async-scheduling")
                + (" --enable-expert-parallel" if f.enable_expert_parallel else ""),
                *self._memory.lines(), *self._memory_caveat(), self.kernel_source]

    def _memory_caveat(self) -> list[str]:
        if self.gpu == "H100":
            return []
        return [f"memory: the H100's visible share of the datasheet figure assumed for the {self.gpu} (no log of "
                "its own): read the KV cache as an upper bound"]


def predict(deployment: Deployment, traffic: Traffic, percentiles: tuple[float, ...] = (50, 90, 99)) -> Prediction:
    """Serve ``traffic`` on ``deployment``'s simulated replicas; the ``Prediction``."""
    check_instance("deployment", deployment, Deployment, "a Deployment")
    check_instance("traffic", traffic, Traffic, "a Traffic (TrafficSpec(...).generate() or read_trace(path))")
    wall = time.perf_counter()
    requests = traffic.requests()
    if deployment.data_parallel_size == 1:
        trace = deployment.engine().run(requests)
    else:
        cluster = Cluster(ClusterConfig(deployment.data_parallel_size, deployment.routing), engine_factory=deployment.engine)
        trace = cluster.run(requests).merged
    setup = {"model": deployment.shape.name, "gpu": deployment.gpu, "traffic": traffic.source}
    return Prediction(trace, setup, deployment.memory.kv_tokens * deployment.data_parallel_size,
                      time.perf_counter() - wall, percentiles)


__all__ = ["Deployment", "predict"]


def predict_disaggregated(prefill: Deployment, decode: Deployment, num_prefill: int, num_decode: int,
                          traffic: Traffic, link: str = "infiniband-ndr",
                          percentiles: tuple[float, ...] = (50, 90, 99)) -> Prediction:
    """Serve ``traffic`` with ``num_prefill`` copies of ``prefill`` computing prompts and
    ``num_decode`` copies of ``decode`` generating tokens, each prompt's KV crossing ``link``
    (``batchlab.cluster.disaggregated``); each side keeps its own TP degree and flags, and
    both serve one model. ``data_parallel_size`` is the pool sizes' job here: keep it 1."""
    for name, d in (("prefill", prefill), ("decode", decode)):
        check_instance(name, d, Deployment, "a Deployment")
        if d.data_parallel_size != 1:
            fail(f"{name}.data_parallel_size", d.data_parallel_size, "1",
                 "the pools' sizes are num_prefill and num_decode")
    check_instance("traffic", traffic, Traffic, "a Traffic (TrafficSpec(...).generate() or read_trace(path))")
    if prefill.shape.name != decode.shape.name:
        fail("decode", decode.shape.name, f"the prefill side's model, {prefill.shape.name}",
             "the decode workers read the KV the prefill workers computed")
    config = DisaggregatedConfig(num_prefill, num_decode, link, prefill.routing, decode.routing)
    kv_bytes = prefill.shape.kv_bytes_per_token(prefill.resolved_flags.dtype_bytes)
    wall = time.perf_counter()
    trace = DisaggregatedCluster(config, prefill.engine, kv_bytes, decode.engine).run(traffic.requests()).merged
    setup = {"model": prefill.shape.name, "gpu": f"{num_prefill} x {prefill.gpu} prefill (TP "
             f"{prefill.tensor_parallel_size}) + {num_decode} x {decode.gpu} decode (TP "
             f"{decode.tensor_parallel_size}) over {link}", "traffic": traffic.source}
    return Prediction(trace, setup, decode.memory.kv_tokens * num_decode, time.perf_counter() - wall, percentiles)
