"""One vLLM replica on simulated GPUs (``batchlab.vllm_sim``), and everything that builds its GPUs from it:
the cluster's replicas, the disaggregated pools and the predictor see the same step and budgets."""

from __future__ import annotations

import pytest

from batchlab.sim import SimBackend
from batchlab.cluster import DisaggregatedCluster, DisaggregatedConfig, ReplicaSpec
from batchlab.engine import Engine
from batchlab.predict import Deployment
from batchlab.requests import Request
from batchlab.schedulers import ContinuousBatcher
from batchlab.speculative import AcceptanceModel, SpeculativeConfig
from batchlab.engine_args import EngineArgs
from batchlab.vllm_sim import VllmReplica
from batchlab.vllm_sim.async_scheduling import AsyncScheduledBatcher


def test_a_cluster_replica_is_the_predictors_replica_with_vllms_defaults_for_the_gpu():
    spec = ReplicaSpec.for_device("Llama-3-8B", "H100")
    deployment = Deployment("Llama-3-8B", "H100")
    assert spec.cost_model == deployment.step_model
    assert spec.kv_capacity_tokens == deployment.memory.kv_tokens
    assert (spec.args.max_num_seqs, spec.args.max_num_batched_tokens, spec.args.max_model_len) == (1024, 8192, 8192)
    assert spec.args.async_scheduling and isinstance(spec.build(0).scheduler, AsyncScheduledBatcher)
    a100 = ReplicaSpec.for_device("Llama-3-8B", "A100")           # vLLM's smaller defaults on an A100
    assert (a100.args.max_num_seqs, a100.args.max_num_batched_tokens) == (256, 2048)


def test_a_cluster_replica_takes_vllms_flags_by_name_and_refuses_others():
    spec = ReplicaSpec.for_device("Llama-3-8B", "H100", max_num_seqs=256, enable_prefix_caching=False, seed=3)
    assert (spec.args.max_num_seqs, spec.args.enable_prefix_caching, spec.seed) == (256, False, 3)
    whole = ReplicaSpec.for_device("Llama-3-8B", "H100", enable_chunked_prefill=False)
    assert not whole.build(0).scheduler.config.chunked_prefill
    tp2 = ReplicaSpec.for_device("Llama-3-8B", "H100", tensor_parallel_size=2)
    assert tp2.kv_capacity_tokens > 2 * spec.kv_capacity_tokens         # half the weights on each GPU
    with pytest.raises(ValueError, match="max_seqs=8; must be one of vLLM's flags"):
        ReplicaSpec.for_device("Llama-3-8B", "H100", max_seqs=8)
    with pytest.raises(ValueError, match="weights=1"):
        ReplicaSpec.for_device("Llama-2-70B", "H100")                     # 140 GB on one 80 GB card


def test_both_pools_of_a_split_run_vllms_replica_and_price_its_kv_in_its_dtype():
    cluster = DisaggregatedCluster.for_device("Llama-3-8B", "H100", DisaggregatedConfig(1, 1))
    replica = VllmReplica("Llama-3-8B", "H100")
    assert cluster.kv_bytes_per_token == replica.kv_bytes_per_token == 32 * 8 * 128 * 2 * 2


def test_an_async_engine_holds_back_the_requests_that_arrived_during_its_step():
    """The same requests on the replica's engine and on a synchronous one: a request arriving while
    a step runs joins one step later with async scheduling."""
    replica = VllmReplica("Llama-3-8B", "H100")
    sync = VllmReplica("Llama-3-8B", "H100", args=EngineArgs(async_scheduling=False))
    reqs = [Request("a", None, 64, 0.0, prompt_len=2000), Request("b", None, 8, 0.005, prompt_len=64)]
    first = {}
    for name, r in (("async", replica), ("sync", sync)):
        trace = r.engine().run([q.fresh_copy() for q in reqs])
        first[name] = next(i for i, s in enumerate(trace.steps) if any(c.request_id == "b" for c in s.chunks))
    assert first["async"] == first["sync"] + 1


def test_an_early_exit_pass_is_the_model_cut_short_without_the_engines_cpu_work():
    step = VllmReplica("Llama-3-8B", "H100").step_model
    draft = step.early_exit(8)
    assert draft.gpu.shape.num_layers == 8 and draft.cpu_seconds(64) == 0.0
    assert 0.2 < draft.predict_features(1, 1, 500) / step.predict_features(1, 1, 500) < 0.5
    config = SpeculativeConfig(2, method="early_exit", early_exit_layer=8)
    backend = SimBackend(step, 100_000, block_size=16, speculative_config=config, acceptance=AcceptanceModel(0.5))
    trace = Engine(ContinuousBatcher(8, 2048), backend).run([Request("r", None, 16, prompt_len=100)])
    assert len(trace.requests[0].token_times) == 16
    with pytest.raises(ValueError, match="early_exit_layer=32; must be in 1..31"):
        step.early_exit(32)


def test_a_simulated_server_refuses_a_model_vllm_could_not_load():
    with pytest.raises(ValueError, match="gpu='B300'"):
        VllmReplica("Llama-3-8B", "B300")
    with pytest.raises(ValueError, match="weights="):
        VllmReplica("Llama-3-8B", "T4")
