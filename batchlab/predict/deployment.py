"""A vLLM deployment (model, GPU, tensor and data parallelism, flags) and its predicted serving.

``Deployment`` is ``data_parallel_size`` copies of one ``VllmReplica`` (``batchlab.vllm_sim``:
the setup checked as vLLM checks it, ``tensor_parallel_size`` GPUs on measured kernels, the KV
blocks vLLM allots, vLLM's scheduler and budgets) and the router between them.
``predict(deployment, traffic)`` serves the traffic on one replica, or on ``data_parallel_size``
replicas behind a ``batchlab.cluster`` router, and returns a ``Prediction``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from batchlab.checks import check_choice, check_instance, check_int, fail
from batchlab.cluster import Cluster, ClusterConfig, DisaggregatedCluster, DisaggregatedConfig
from batchlab.cluster.policies import ROUTING_POLICIES
from batchlab.engine import Engine
from batchlab.predict.report import Prediction
from batchlab.predict.traffic import Traffic
from batchlab.shapes import ModelShape
from batchlab.engine_args import EngineArgs
from batchlab.vllm_sim import VllmReplica, VllmStepModel
from batchlab.vllm_sim.memory import MemoryPlan


@dataclass(frozen=True)
class Deployment:
    """``data_parallel_size`` replicas of ``model`` (a ``MODEL_SHAPES`` name, a ``config.json``
    path or a ``ModelShape``), each over ``tensor_parallel_size`` GPUs of preset ``gpu``
    (``batchlab.vllm_sim.VllmReplica``)."""

    model: str | ModelShape
    gpu: str
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    args: EngineArgs = field(default_factory=EngineArgs)
    routing: str = "least_outstanding"
    vllm_version: str | None = None      # the measured kernels' vLLM version (None: the newest)

    def __post_init__(self) -> None:
        check_int("data_parallel_size", self.data_parallel_size, hint="--data-parallel-size")
        check_choice("routing", self.routing, ROUTING_POLICIES)
        object.__setattr__(self, "replica",
                           VllmReplica(self.model, self.gpu, self.tensor_parallel_size,
                                                        self.args, self.vllm_version))

    # each replica, as vLLM builds it
    replica: VllmReplica = field(init=False, repr=False, compare=False)

    @property
    def shape(self) -> ModelShape:
        return self.replica.shape

    @property
    def resolved_args(self) -> EngineArgs:
        return self.replica.resolved_args

    @property
    def memory(self) -> MemoryPlan:
        return self.replica.memory

    @property
    def step_model(self) -> VllmStepModel:
        return self.replica.step_model

    @property
    def kernel_source(self) -> str:
        return self.replica.kernel_source

    @property
    def num_gpus(self) -> int:
        return self.tensor_parallel_size * self.data_parallel_size

    def engine(self, index: int = 0) -> Engine:
        """One replica's engine on the virtual clock."""
        return self.replica.engine(index)

    def describe(self) -> list[str]:
        f = self.resolved_args
        return [f"{self.shape.name} on {self.data_parallel_size} x {self.tensor_parallel_size} "
                f"{self.gpu} ({self.num_gpus} GPUs; tensor parallel {self.tensor_parallel_size}, "
                f"{self.data_parallel_size} replica{'s' if self.data_parallel_size > 1 else ''}"
                + (f" behind a {self.routing} router" if self.data_parallel_size > 1 else "")
                + f"), {f.dtype}",
                *self.replica.describe()]


def predict(deployment: Deployment, traffic: Traffic,
            percentiles: tuple[float, ...] = (50, 90, 99)) -> Prediction:
    """Serve ``traffic`` on ``deployment``'s simulated replicas; the ``Prediction``."""
    check_instance("deployment", deployment, Deployment, "a Deployment")
    check_instance("traffic", traffic, Traffic,
                   "a Traffic (TrafficSpec(...).generate() or read_trace(path))")
    wall = time.perf_counter()
    requests = traffic.requests()
    if deployment.data_parallel_size == 1:
        trace = deployment.engine().run(requests)
    else:
        cluster = Cluster(ClusterConfig(deployment.data_parallel_size, deployment.routing),
                          engine_factory=deployment.engine)
        trace = cluster.run(requests).merged
    setup = {"model": deployment.shape.name, "gpu": deployment.gpu, "traffic": traffic.source}
    return Prediction(trace, setup, deployment.memory.kv_tokens * deployment.data_parallel_size,
                      time.perf_counter() - wall, percentiles)


__all__ = ["Deployment", "predict"]


def predict_disaggregated(prefill: Deployment, decode: Deployment, num_prefill: int,
                          num_decode: int, traffic: Traffic, link: str = "infiniband-ndr",
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
    check_instance("traffic", traffic, Traffic,
                   "a Traffic (TrafficSpec(...).generate() or read_trace(path))")
    if prefill.shape.name != decode.shape.name:
        fail("decode", decode.shape.name, f"the prefill side's model, {prefill.shape.name}",
             "the decode workers read the KV the prefill workers computed")
    config = DisaggregatedConfig(num_prefill, num_decode, link, prefill.routing, decode.routing)
    kv_bytes = prefill.shape.kv_bytes_per_token(prefill.resolved_args.dtype_bytes)
    wall = time.perf_counter()
    trace = DisaggregatedCluster(config, prefill.engine, kv_bytes,
                                 decode.engine).run(traffic.requests()).merged
    setup = {"model": prefill.shape.name, "gpu": f"{num_prefill} x {prefill.gpu} prefill (TP "
             f"{prefill.tensor_parallel_size}) + {num_decode} x {decode.gpu} decode (TP "
             f"{decode.tensor_parallel_size}) over {link}", "traffic": traffic.source}
    return Prediction(trace, setup, decode.memory.kv_tokens * num_decode,
                      time.perf_counter() - wall, percentiles)
