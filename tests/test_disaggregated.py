"""Prefill here, decode there: the disaggregated cluster simulator (``batchlab.cluster.disaggregated``)
and what the engine does with KV computed elsewhere (``Request.kv_transfer``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from batchlab.analysis.metrics import summary_row
from batchlab.sim import SimBackend
from batchlab.steptime.roofline import model_shape
from batchlab.cluster import Cluster, ClusterConfig, ReplicaSpec
from batchlab.cluster.disaggregated import KV_LINKS, DisaggregatedCluster, DisaggregatedConfig, KVLink
from batchlab.cluster.pd_goodput import attainment_table, goodput_by_layout, layouts
from batchlab.engine import Engine
from batchlab.kv_blocks import BlockManager
from batchlab.model.kv_cache import KVCache
from batchlab.requests import FinishReason, KVTransfer, Request, RequestStatus
from batchlab.schedulers import ContinuousBatcher, StaticBatcher
from batchlab.schedulers.continuous import ready_tokens
from batchlab.workloads import Range

MODEL, GPU = "Llama-3-8B", "H100"
KV_BYTES = model_shape(MODEL).kv_bytes_per_token(2)          # bf16 on the H100 preset


def long_prompts(n: int, rate: float, seed: int = 0) -> list[Request]:
    """Poisson arrivals of 1,500-3,000-token prompts, 256 output tokens each."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1 / rate, n))
    return [Request(f"r{i}", None, 256, float(t), prompt_len=int(rng.integers(1500, 3000)))
            for i, t in enumerate(times)]


def one_request(link: str, prompt_len: int = 2000):
    cluster = DisaggregatedCluster.for_device(MODEL, GPU, DisaggregatedConfig(1, 1, link=link))
    return cluster.run([Request("only", None, 8, 1.0, prompt_len=prompt_len)])


def test_every_request_is_served_once_and_no_decode_step_holds_a_prefill():
    reqs = long_prompts(120, rate=6)
    result = DisaggregatedCluster.for_device(MODEL, GPU, DisaggregatedConfig(2, 2)).run(reqs)
    records = result.merged.requests
    assert [r.request_id for r in records] == [q.request_id for q in reqs]
    assert all(r.status is RequestStatus.FINISHED and len(r.token_times) == 256 for r in records)
    prefill_chunks = [c for t in result.prefill.traces for s in t.steps for c in s.chunks]
    decode_chunks = [c for t in result.decode.traces for s in t.steps for c in s.chunks]
    # The prefill pool computed every prompt; the decode pool one token per position it decodes
    # (the last prompt token, then every output token but the last).
    assert sum(c.num_tokens for c in prefill_chunks) == sum(q.prompt_len for q in reqs)
    assert max(c.num_tokens for c in decode_chunks) == 1
    assert sum(c.num_tokens for c in decode_chunks) == 256 * len(reqs)
    assert len(result.transfers) == len(reqs)
    sent = dict(zip(result.transfers["request_id"], result.transfers["kv_bytes"]))
    assert sent == {q.request_id: q.prompt_len * KV_BYTES for q in reqs}


def test_ttft_is_the_prefill_the_transfer_and_one_decode_step():
    result = one_request("infiniband-ndr")
    (prefill_step,) = result.prefill.traces[0].steps
    first_decode = result.decode.traces[0].steps[0]
    (transfer,) = result.transfers.itertuples()
    assert transfer.transfer_start == prefill_step.end
    assert transfer.transfer_s == pytest.approx(KV_LINKS["infiniband-ndr"].transfer_time(2000 * KV_BYTES))
    assert first_decode.start == transfer.kv_arrived
    (record,) = result.merged.requests
    assert record.token_times[0] == first_decode.end
    ttft = record.token_times[0] - record.arrival_time
    assert ttft == pytest.approx(prefill_step.duration + transfer.transfer_s + first_decode.duration)


def test_a_slower_link_delays_the_first_token_by_the_longer_transfer():
    fast, slow = one_request("nvlink4"), one_request("ethernet-25g")
    ttft = [r.merged.requests[0].token_times[0] for r in (fast, slow)]
    transfer = [float(r.transfers["transfer_s"].iloc[0]) for r in (fast, slow)]
    assert ttft[1] - ttft[0] == pytest.approx(transfer[1] - transfer[0], rel=1e-9)
    assert transfer[1] > 100 * transfer[0]                      # 25 Gb/s Ethernet against NVLink's 450 GB/s


def test_one_prefill_workers_transfers_take_turns_on_its_link():
    reqs = [Request(f"r{i}", None, 4, 0.0, prompt_len=600) for i in range(3)]    # one prefill step for all
    cluster = DisaggregatedCluster.for_device(MODEL, GPU, DisaggregatedConfig(1, 1, link="ethernet-100g"))
    t = cluster.run(reqs).transfers.sort_values("transfer_start")
    assert t["prefill_end"].nunique() == 1
    assert t["transfer_start"].iloc[1:].to_numpy() == pytest.approx(t["kv_arrived"].iloc[:-1].to_numpy(), rel=1e-12)


def test_disaggregation_removes_the_prefill_stall_from_decode_gaps():
    """Long prompts arriving among decodes: on two colocated GPUs a newcomer's prefill shares a
    step with everyone's next token; on one prefill GPU and one decode GPU it never does."""
    reqs = long_prompts(300, rate=8)
    spec = ReplicaSpec.for_device(MODEL, GPU)
    colocated = summary_row(Cluster(ClusterConfig(2, policy="least_outstanding"), spec).run(reqs).merged)
    split = summary_row(DisaggregatedCluster.for_device(MODEL, GPU, DisaggregatedConfig(1, 1)).run(reqs).merged)
    # Measured: ITL p99 51 ms colocated, 12.6 ms split (deterministic: the simulator, no noise).
    assert split["itl_p99"] < 0.5 * colocated["itl_p99"], (split["itl_p99"], colocated["itl_p99"])
    assert split["ttft_p50"] > colocated["ttft_p50"]          # what it costs: one prefill GPU, the transfer


def test_a_request_the_prefill_pool_rejects_is_in_the_result_with_its_reason():
    spec = ReplicaSpec.for_device(MODEL, GPU, max_model_len=4096)
    cluster = DisaggregatedCluster(DisaggregatedConfig(1, 1), spec, KV_BYTES)
    result = cluster.run([Request("fits", None, 8, 0.0, prompt_len=1000),
                          Request("too-long", None, 8, 0.5, prompt_len=5000)])
    by_id = {r.request_id: r for r in result.merged.requests}
    assert by_id["fits"].status is RequestStatus.FINISHED
    assert by_id["too-long"].finish_reason is FinishReason.REJECTED and "4096" in by_id["too-long"].finish_detail
    assert list(result.transfers["request_id"]) == ["fits"]
    df = result.requests_df().set_index("request_id")
    assert df.loc["fits", "kv_bytes"] == 1000 * KV_BYTES and np.isnan(df.loc["too-long", "kv_bytes"])


@pytest.mark.parametrize("kwargs, message", [
    ({"num_prefill": 0, "num_decode": 1}, "num_prefill=0"),
    ({"num_prefill": 1, "num_decode": 0}, "num_decode=0"),
    ({"num_prefill": 1, "num_decode": 1, "link": "carrier-pigeon"}, "link='carrier-pigeon'"),
    ({"num_prefill": 1, "num_decode": 1, "decode_policy": "fastest"}, "fastest"),
])
def test_bad_configs_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DisaggregatedConfig(**kwargs)


def test_bad_links_and_sizes_are_named():
    with pytest.raises(ValueError, match="bandwidth=0"):
        KVLink("none", 0, 0.0, "nowhere")
    with pytest.raises(ValueError, match="kv_bytes_per_token=0"):
        DisaggregatedCluster(DisaggregatedConfig(1, 1), ReplicaSpec.for_device(MODEL, GPU), 0)


# --- the engine's side: KV computed elsewhere --------------------------------------------------
def test_kv_transfer_must_leave_the_last_prompt_token():
    with pytest.raises(ValueError, match=r"kv_transfer=KVTransfer\(tokens=10.*must be a KVTransfer of at most "
                                         r"prompt_len - 1 = 9 tokens"):
        Request("r", None, 4, prompt_len=10, kv_transfer=KVTransfer(10))


def test_continuous_batching_computes_only_what_did_not_arrive():
    engine = Engine(ContinuousBatcher(8, 512), SimBackend(ReplicaSpec.for_device(MODEL, GPU).cost_model, 100_000,
                                                            block_size=16))
    trace = engine.run([Request("r", None, 3, prompt_len=300, kv_transfer=KVTransfer(299))])
    assert [[(c.start, c.num_tokens) for c in s.chunks] for s in trace.steps] == [[(299, 1)], [(300, 1)], [(301, 1)]]


def test_kv_in_flight_holds_its_blocks_and_computes_nothing_until_it_lands():
    """vLLM's "waiting for remote KVs": admitted at once (blocks and a seat), first chunk at the
    first step after the KV has landed; a request beside it runs meanwhile."""
    cost = ReplicaSpec.for_device(MODEL, GPU).cost_model
    engine = Engine(ContinuousBatcher(8, 512), SimBackend(cost, 100_000, block_size=16))
    pulled = Request("pulled", None, 3, 0.0, prompt_len=300, kv_transfer=KVTransfer(299, seconds=0.5))
    local = Request("local", None, 40, 0.0, prompt_len=100)
    trace = engine.run([pulled, local])
    steps = [(s.start, [c.request_id for c in s.chunks]) for s in trace.steps]
    first = next(i for i, (_, ids) in enumerate(steps) if "pulled" in ids)
    assert steps[first][0] >= 0.5 and steps[first - 1][0] < 0.5 and "local" in steps[0][1]
    assert all("pulled" not in ids for _, ids in steps[:first])
    assert steps[first][1].count("pulled") == 1 and trace.steps[first].chunks[-1].num_tokens == 1


def test_kv_in_flight_waits_for_room_and_the_pull_starts_when_it_has_blocks():
    """A decode worker with room for one request at a time: the second's KV is pulled only once the
    first has finished and freed its blocks."""
    engine = Engine(ContinuousBatcher(8, 512), SimBackend(ReplicaSpec.for_device(MODEL, GPU).cost_model, 320,
                                                            block_size=16))
    reqs = [Request(f"r{i}", None, 8, 0.0, prompt_len=300, kv_transfer=KVTransfer(299, seconds=0.1))
            for i in range(2)]
    trace = engine.run(reqs)
    first_step = {c.request_id: s.start for s in reversed(trace.steps) for c in s.chunks}
    assert first_step["r0"] == pytest.approx(0.1)
    assert first_step["r1"] == pytest.approx(trace.requests[0].token_times[-1] + 0.1)
    assert all(r.status is RequestStatus.FINISHED for r in trace.requests)


@pytest.mark.parametrize("kwargs, message", [({"tokens": 0}, "kv_transfer.tokens=0"),
                                             ({"tokens": 9, "seconds": -1}, "kv_transfer.seconds=-1"),
                                             ({"tokens": 9, "not_before": float("nan")}, "kv_transfer.not_before=nan")])
def test_bad_transfers_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        KVTransfer(**kwargs)
    with pytest.raises(ValueError, match="must be a KVTransfer"):
        Request("r", None, 4, prompt_len=10, kv_transfer={"tokens": 9})


def test_a_preempted_request_computes_its_transferred_prompt_again():
    kv = BlockManager(num_blocks=64, block_size=16)
    req = Request("r", None, 4, prompt_len=300, kv_transfer=KVTransfer(299))
    assert ready_tokens(kv, req) == 299
    req.first_scheduled_time = 0.0                  # it ran, was preempted, and waits again
    assert ready_tokens(kv, req) == 0


def test_policies_and_caches_that_cannot_take_transferred_kv_reject_it_with_the_reason():
    req = Request("r", None, 4, prompt_len=300, kv_transfer=KVTransfer(299))
    static = StaticBatcher(4)
    static.bind(BlockManager(num_blocks=64, block_size=16))
    assert "StaticBatcher computes every prompt itself" in static.why_unschedulable(req)
    continuous = ContinuousBatcher(8, 512)
    continuous.bind(KVCache(num_layers=1, num_kv_heads=1, head_dim=8, num_slots=2, max_seq_len=512))
    assert "without the keys and values themselves (kv_transfer.kv)" in continuous.why_unschedulable(req)


# --- where it pays: DistServe's goodput of the same GPUs, colocated or split ---------------------
def test_long_prompts_under_a_tight_tpot_bound_favour_the_split():
    """Two H100s, prompts of 2,000-4,000 tokens, TTFT <= 1 s and TPOT <= 12 ms for 90% of requests:
    measured 4.6 req/s colocated, 6.0 split (200 requests per point; 4.8 and 6.2 with 300)."""
    table = attainment_table(MODEL, GPU, 2, [2, 3, 4, 5, 6, 7, 8], {"ttft": 1.0, "tpot": 0.012}, num_requests=200,
                             prompt_len=Range(2000, 4000), output_len=Range(128, 384))
    best = goodput_by_layout(table, 2)["goodput"]
    assert best["1P1D"] > 1.15 * best["colocated"], best.to_dict()


def test_short_prompts_favour_colocation():
    """Prompts of 64-256 tokens: one decode GPU carries half the decodes two colocated ones do, and
    the prefill GPU idles. Measured (600 requests per point), 90% within TTFT 0.5 s and TPOT 15 ms:
    colocated 268 req/s, the split 70."""
    table = attainment_table(MODEL, GPU, 2, [60, 120, 180, 240, 300, 400], {"ttft": 0.5, "tpot": 0.015},
                             num_requests=600, prompt_len=Range(64, 256), output_len=Range(128, 384))
    best = goodput_by_layout(table, 2)["goodput"]
    assert np.isfinite(best).all(), best.to_dict()          # each layout fell short within the sweep
    assert best["colocated"] > 1.5 * best["1P1D"], best.to_dict()


def test_layouts_split_the_gpus_every_way_and_bad_ones_are_named():
    assert layouts(3) == ["colocated", "1P2D", "2P1D"]
    with pytest.raises(ValueError, match="num_gpus=1"):
        layouts(1)
    with pytest.raises(ValueError, match="layout='3P1D'"):
        attainment_table(MODEL, GPU, 2, [1.0], {"ttft": 1.0}, num_requests=10, prompt_len=64, output_len=8,
                         layout_names=["3P1D"])


# --- faults: nothing is lost ----------------------------------------------------------------------
def test_a_prefill_worker_that_dies_mid_transfer_loses_that_kv_and_says_so():
    """Two prefill workers over slow Ethernet (a 2,000-token prompt's KV takes 84 ms); worker 0 dies
    while sending. What it had not delivered ends aborted with the reason; what arrives later goes
    to worker 1; everything else finishes."""
    cluster = DisaggregatedCluster.for_device(MODEL, GPU, DisaggregatedConfig(2, 1, link="ethernet-25g",
                                                                              prefill_policy="round_robin"))
    reqs = [Request(f"r{i}", None, 16, 0.02 * i, prompt_len=2000) for i in range(20)]
    cluster.kill("prefill", 0, at=0.2)
    result = cluster.run(reqs)
    by_id = {r.request_id: r for r in result.merged.requests}
    assert set(by_id) == {q.request_id for q in reqs}
    aborted = [r for r in by_id.values() if r.status is RequestStatus.ABORTED]
    in_flight = [r for r in aborted if "never received" in r.finish_detail]     # measured: 3 of them
    assert len(in_flight) >= 2
    assert all(r.finish_detail.startswith("prefill worker 0 died at t=0.2 s before its KV reached") for r in in_flight)
    sent = result.transfers.set_index("request_id")
    assert all(np.isnan(sent.loc[r.request_id, "kv_arrived"]) and sent.loc[r.request_id, "prefill_replica"] == 0
               for r in in_flight)
    assert all("replica 0 died at t=0.2 s" in r.finish_detail for r in aborted if r not in in_flight)  # mid-prefill
    assert all(r.status is RequestStatus.FINISHED and len(r.token_times) == 16
               for r in by_id.values() if r.status is not RequestStatus.ABORTED)
    after = [by_id[q.request_id] for q in reqs if q.arrival_time >= 0.2]
    assert len(after) == 10 and all(r.status is RequestStatus.FINISHED for r in after)


def test_the_decode_pool_holds_kv_in_flight_so_a_full_decode_worker_delays_the_transfer():
    """A decode worker with KV room for one request: each hand-off waits for the previous request's
    blocks, and its transfer starts then, not when its prefill ended."""
    prefill = ReplicaSpec.for_device(MODEL, GPU)
    decode = replace(prefill, kv_capacity_tokens=2100)
    cluster = DisaggregatedCluster(DisaggregatedConfig(1, 1, link="ethernet-100g"), prefill, KV_BYTES, decode=decode)
    reqs = [Request(f"r{i}", None, 32, 0.0, prompt_len=2000) for i in range(3)]
    result = cluster.run(reqs)
    t = result.transfers.set_index("request_id")
    done = {r.request_id: r.token_times[-1] for r in result.merged.requests}
    assert all(r.status is RequestStatus.FINISHED for r in result.merged.requests)
    assert t.loc["r1", "transfer_start"] >= done["r0"] and t.loc["r2", "transfer_start"] >= done["r1"]
    assert (t["transfer_s"] == t["transfer_s"].iloc[0]).all()


def test_a_request_preempted_after_its_kv_landed_keeps_its_transfer_in_the_log():
    """A decode worker too small for two long answers preempts one after it started; it computes its
    prompt again there, and the log still says when its KV landed."""
    prefill = ReplicaSpec.for_device(MODEL, GPU)
    decode = replace(prefill, kv_capacity_tokens=1400)
    cluster = DisaggregatedCluster(DisaggregatedConfig(1, 1), prefill, KV_BYTES, decode=decode)
    result = cluster.run([Request(f"r{i}", None, 400, 0.0, prompt_len=500) for i in range(2)])
    preempted = {p.request_id for t in result.decode.traces for p in t.preemptions}
    assert preempted, "the decode worker should have run out of KV room"
    t = result.transfers.set_index("request_id")
    assert t["kv_arrived"].notna().all() and (t["transfer_start"] >= t["prefill_end"]).all()
    assert all(r.status is RequestStatus.FINISHED and len(r.token_times) == 400 for r in result.merged.requests)


def test_a_decode_worker_that_dies_aborts_its_streams_and_the_other_takes_the_rest():
    cluster = DisaggregatedCluster.for_device(MODEL, GPU, DisaggregatedConfig(1, 2))
    reqs = [Request(f"r{i}", None, 200, 0.05 * i, prompt_len=1000) for i in range(20)]
    cluster.kill("decode", 0, at=0.5)
    records = cluster.run(reqs).merged.requests
    aborted = [r for r in records if r.status is RequestStatus.ABORTED]
    assert aborted and all("replica 0 died at t=0.5 s" in r.finish_detail for r in aborted)
    assert all(r.status is RequestStatus.FINISHED for r in records if r.arrival_time > 0.5)
    assert len(records) == len(reqs)


@pytest.mark.parametrize("args, message", [(("router", 0, 1.0), "pool='router'"),
                                           (("decode", 2, 1.0), r"replica=2; must be an int in 0..1"),
                                           (("prefill", 0, -1.0), "at=-1")])
def test_bad_kills_are_named(args, message):
    cluster = DisaggregatedCluster.for_device(MODEL, GPU, DisaggregatedConfig(1, 2))
    with pytest.raises(ValueError, match=message):
        cluster.kill(*args)


# --- through the predictor: vLLM's engine model on each side --------------------------------------
def test_the_predictor_splits_a_vllm_deployment_and_the_stall_goes():
    """``predict_disaggregated``: vLLM V1's step model (measured kernels, CUDA graphs, async
    scheduling) on both pools. Measured: ITL p99 72.9 ms on two replicas, 9.6 ms split 1P1D."""
    from batchlab.predict import Deployment, TrafficSpec, predict, predict_disaggregated
    traffic = TrafficSpec(300, 8.0, input_len=3000, output_len=256, seed=0).generate()
    colocated = predict(Deployment(MODEL, GPU, data_parallel_size=2), traffic)
    split = predict_disaggregated(Deployment(MODEL, GPU), Deployment(MODEL, GPU), 1, 1, traffic)
    assert split.trace.meta["num_requests"] == 300 and split.setup["gpu"].startswith("1 x H100 prefill")
    itl_p99 = [np.percentile(p.values("itl"), 99) for p in (colocated, split)]
    assert itl_p99[1] < 0.5 * itl_p99[0], itl_p99


def test_the_predictor_refuses_a_split_it_cannot_serve():
    from batchlab.predict import Deployment, TrafficSpec, predict_disaggregated
    traffic = TrafficSpec(4, 1.0, input_len=100, output_len=8).generate()
    with pytest.raises(ValueError, match="prefill.data_parallel_size=2"):
        predict_disaggregated(Deployment(MODEL, GPU, data_parallel_size=2), Deployment(MODEL, GPU), 1, 1, traffic)
    with pytest.raises(ValueError, match="decode='Llama-2-7B'"):
        predict_disaggregated(Deployment(MODEL, GPU), Deployment("Llama-2-7B", GPU), 1, 1, traffic)
