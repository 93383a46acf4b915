"""The cluster: routing policies on hand-built states, the cluster driver, dead replicas, sweeps.

Every simulation here is small (a few hundred requests on a few replicas, under a second).
"""

from __future__ import annotations

import ast
import dataclasses
import random
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from batchlab.analysis.metrics import summary_row
from batchlab.steptime.roofline import RooflineCostModel
from batchlab.engine_args import EngineArgs
from batchlab.cluster import ROUTING_POLICIES, Cluster, ClusterConfig, ReplicaSpec, RouteRequest, make_router
from batchlab.cluster.cache_aware import CacheAwareConfig, CacheAwareRouter
from batchlab.cluster.kv_aware import KVAwareRouter
from batchlab.cluster.prefix_index import PrefixIndex, block_hashes
from batchlab.cluster.simple_policies import ConsistentHashConfig, ConsistentHashRouter
from batchlab.cluster.sweep import cluster_point, grid, run_sweep
from batchlab.cluster.weighted import WeightedConfig, WeightedScorerRouter
from batchlab.workloads import SessionShape, ideal_prefix_reuse, make_sessions

ROOFLINE = RooflineCostModel.for_device("Llama-3-8B", "H100")
BLOCK = 16


class FakeReports:
    """Hand-built replica reports: fixed queue depths, KV usage and stored prefix blocks."""

    def __init__(self, n: int, waiting=None, usage=None, stored=None, block_size: int = BLOCK, load=None) -> None:
        self._waiting = list(waiting or [0] * n)
        self._load = list(load or [0] * n)
        self._usage = list(usage or [0.0] * n)
        self._stored = list(stored or [0] * n)
        self.block_size, self.now = block_size, 0.0

    def waiting(self, r: int) -> int:
        return self._waiting[r]

    def load(self, r: int) -> int:
        return self._load[r]

    def kv_usage(self, r: int) -> float:
        return self._usage[r]

    def stored_blocks(self, r: int, hashes) -> int:
        return min(self._stored[r], len(hashes))


def request(rid: str, prompt: list[int], session: str | None = None) -> RouteRequest:
    return RouteRequest(rid, prompt, len(prompt), session, 0.0)


def prompt(start: int, blocks: int) -> list[int]:
    return list(range(start, start + blocks * BLOCK))


# --- the simple policies -------------------------------------------------------------------------
def test_round_robin_cycles_over_the_alive_replicas():
    router = make_router("round_robin", 3)
    reports = FakeReports(3)
    assert [router.route(request(f"r{i}", [1]), reports).replica for i in range(4)] == [0, 1, 2, 0]
    router.replica_died(1)
    assert {router.route(request(f"x{i}", [1]), reports).replica for i in range(4)} == {0, 2}


def test_random_is_seeded_and_uses_every_replica():
    routers = [make_router("random", 4, seed=7) for _ in range(2)]
    picks = [[router.route(request(f"r{i}", [1]), FakeReports(4)).replica for i in range(20)] for router in routers]
    assert picks[0] == picks[1]
    router = make_router("random", 4, seed=7)
    counts = Counter(router.route(request(f"r{i}", [1]), FakeReports(4)).replica for i in range(400))
    assert set(counts) == {0, 1, 2, 3} and min(counts.values()) > 60


def test_least_outstanding_takes_the_fewest_in_flight():
    router = make_router("least_outstanding", 3)
    router.in_flight = [5, 2, 9]
    assert router.route(request("a", [1]), FakeReports(3)).replica == 1
    assert router.in_flight == [5, 3, 9]
    router.request_ended("a", 1, 1.0)
    assert router.in_flight == [5, 2, 9]


def test_power_of_two_takes_the_less_loaded_of_two():
    router = make_router("power_of_two", 2, seed=3)
    router.in_flight = [4, 1]
    assert all(router.choose(request(f"r{i}", [1]), FakeReports(2)).replica == 1 for i in range(20))
    router = make_router("power_of_two", 3, seed=3)
    router.in_flight = [10, 5, 0]
    counts = Counter(router.choose(request(f"r{i}", [1]), FakeReports(3)).replica for i in range(300))
    assert counts[2] > counts[1] > counts[0] == 0       # the most loaded never wins a pair


def test_power_of_two_polled_compares_reported_loads_not_its_own_count():
    router = make_router("power_of_two", 2, seed=3, params={"load": "polled"})
    assert router.metrics_interval_s == 30.0                 # vllm-router's --worker-startup-check-interval
    router.in_flight = [0, 9]                                # its own count: ignored under "polled"
    assert all(router.choose(request(f"r{i}", [1]), FakeReports(2, load=[4, 1])).replica == 1 for i in range(20))
    ideal = make_router("power_of_two", 2, seed=3)
    ideal.in_flight = [0, 9]
    assert all(ideal.choose(request(f"r{i}", [1]), FakeReports(2, load=[4, 1])).replica == 0 for i in range(20))
    with pytest.raises(ValueError, match="load='stale'"):
        make_router("power_of_two", 2, params={"load": "stale"})


def test_power_of_two_polled_reads_loads_at_each_poll_only(sessions):
    # Polled once, at the start, when every replica is idle: every pair ties and the first drawn
    # wins, whatever happens later. Polled often, the loads steer some choices away from that.
    rng = random.Random(0)
    first_drawn = [rng.sample(range(4), 2)[0] for _ in sessions.requests]
    runs = {interval: Cluster(ClusterConfig(4, "power_of_two", {"load": "polled", "poll_interval_s": interval}),
                              spec()).run(sessions.requests).routing["replica"].tolist() for interval in (1e6, 0.01)}
    assert runs[1e6] == first_drawn
    assert runs[0.01] != first_drawn


def test_consistent_hash_keeps_sessions_and_moves_only_a_dead_replicas_keys():
    router = ConsistentHashRouter(4)
    reports = FakeReports(4)
    before = {f"s{i}": router.choose(request(f"r{i}", [i], session=f"s{i}"), reports).replica for i in range(200)}
    assert len(set(before.values())) == 4
    assert router.choose(request("other", [99], session="s5"), reports).replica == before["s5"]
    router.replica_died(2)
    after = {s: router.choose(request("r", [0], session=s), reports).replica for s in before}
    assert all(after[s] == before[s] for s in before if before[s] != 2)
    assert all(after[s] != 2 for s in before)
    by_prefix = ConsistentHashRouter(4, config=ConsistentHashConfig(key="prefix", prefix_tokens=32))
    shared = prompt(0, 2)
    assert len({by_prefix.choose(request(f"r{i}", shared + [i], session=f"s{i}"), reports).replica
                for i in range(20)}) == 1


# --- cache-aware: vllm-router's rule and thresholds ----------------------------------------------
def cache_aware_with_history() -> tuple[CacheAwareRouter, list[int]]:
    """Replica 1 was sent a 10-block prompt; nothing else was sent anywhere."""
    router = CacheAwareRouter(3)
    history = prompt(0, 10)
    router.tree.insert(block_hashes(history, BLOCK), 1)
    return router, history


def test_cache_aware_routes_to_the_longest_match_above_the_threshold():
    router, history = cache_aware_with_history()
    router.in_flight = [0, 5, 0]
    decision = router.choose(request("a", history[:4 * BLOCK] + [7] * BLOCK), FakeReports(3))  # 4/5 blocks
    assert (decision.replica, decision.reason, decision.predicted_hit_tokens) == (1, "cache_affinity", 4 * BLOCK)


def test_cache_aware_threshold_is_strict_and_falls_back_to_the_least_loaded():
    router, history = cache_aware_with_history()
    router.in_flight = [3, 2, 1]
    at_threshold = history[:3 * BLOCK] + [7] * (7 * BLOCK)     # 3 of 10 blocks: match rate 0.3, not > 0.3
    decision = router.choose(request("a", at_threshold), FakeReports(3))
    assert (decision.replica, decision.reason) == (2, "low_match_min_load")
    assert decision.predicted_hit_tokens == 0                  # replica 2 holds none of it
    above = history[:3 * BLOCK] + [7] * (6 * BLOCK)            # 3 of 9 blocks: 0.33 > 0.3
    assert router.choose(request("b", above), FakeReports(3)).replica == 1


@pytest.mark.parametrize("loads, imbalanced", [
    ([70, 0, 0], True),        # 70 - 0 > 64 and 70 > 0 * 1.5
    ([64, 0, 0], False),       # 64 - 0 is not > 64
    ([200, 130, 150], True),   # 70 > 64 and 200 > 195
    ([300, 210, 250], False),  # 90 > 64, but 300 is not > 315: both must hold
])
def test_cache_aware_balances_only_when_both_thresholds_are_exceeded(loads, imbalanced):
    router, history = cache_aware_with_history()
    router.in_flight = list(loads)
    decision = router.choose(request("a", history), FakeReports(3))
    assert router.is_imbalanced() is imbalanced
    if imbalanced:
        assert (decision.replica, decision.reason) == (loads.index(min(loads)), "load_balance")
    else:
        assert (decision.replica, decision.reason) == (1, "cache_affinity")


def test_cache_aware_prunes_its_tree_every_interval():
    router = CacheAwareRouter(2, config=CacheAwareConfig(eviction_interval_s=10, max_tree_tokens=4 * BLOCK))
    reports = FakeReports(2)
    router.route(request("a", prompt(0, 10)), reports)
    assert router.tree.num_blocks(0) + router.tree.num_blocks(1) == 10
    reports.now = 10.5
    router.route(request("b", prompt(5000, 1)), reports)
    assert max(router.tree.num_blocks(r) for r in (0, 1)) <= 5 and router.num_pruned_blocks == 6


def test_prefix_index_prunes_the_ends_of_prompts_first():
    index = PrefixIndex(2, BLOCK)
    hashes = block_hashes(prompt(0, 6), BLOCK)
    index.insert(hashes, 0)
    index.insert(hashes[:2], 1)
    assert index.longest_matches(hashes) == ({0: 6, 1: 2}, 0)
    index.prune(0, 3)
    assert index.longest_matches(hashes) == ({0: 3, 1: 2}, 0)
    index.drop(0)
    assert index.longest_matches(hashes) == ({1: 2}, 1)


# --- Dynamo's KV cost and llm-d's weighted scorers ---------------------------------------------
def test_kv_aware_takes_the_lowest_prefill_plus_decode_cost():
    router = KVAwareRouter(2)
    router.active_blocks = [6, 0]
    reports = FakeReports(2, stored=[4, 0])
    req = request("a", prompt(0, 5) + [1])          # 6 blocks, 5 of them full
    # replica 0: prefill 6 - 4 = 2, decode 6 + 6 = 12 -> 14; replica 1: prefill 6, decode 6 -> 12
    assert router.costs(req, reports) == {0: 14.0, 1: 12.0}
    assert router.choose(req, reports).replica == 1
    heavier = KVAwareRouter(2, config=dataclasses.replace(router.config, overlap_score_weight=2.0))
    heavier.active_blocks = [6, 0]
    assert heavier.costs(req, reports) == {0: 16.0, 1: 18.0}
    decision = heavier.route(req, reports)
    assert (decision.replica, decision.predicted_hit_tokens) == (0, 4 * BLOCK)
    assert (heavier.active_blocks, heavier.prefill_blocks) == ([12, 0], [2, 0])
    heavier.first_token("a", 0, 1.0)
    heavier.request_ended("a", 0, 2.0)
    assert (heavier.active_blocks, heavier.prefill_blocks, heavier.in_flight) == ([6, 0], [0, 0], [0, 0])


def test_weighted_scores_follow_llm_d_scorers():
    router = WeightedScorerRouter(3)
    router.index.insert(block_hashes(prompt(0, 4), BLOCK), 0)
    reports = FakeReports(3, waiting=[10, 0, 5], usage=[0.5, 0.9, 0.0])
    scores = router.scores(request("a", prompt(0, 4)), reports)
    assert scores == {0: (1.0, 0.0, 0.5), 1: (0.0, 1.0, pytest.approx(0.1)), 2: (0.0, 0.5, 1.0)}
    # totals 3*p + 2*q + 2*k: 4.0, 2.2, 3.0 -> replica 0; prefix-only scoring agrees,
    assert router.choose(request("a", prompt(0, 4)), reports).replica == 0
    loaded = FakeReports(3, waiting=[10, 0, 0], usage=[0.95, 0.0, 0.0])   # 3 + 0 + 0.1 < 0 + 2 + 2
    assert router.choose(request("b", prompt(0, 4)), loaded).replica in (1, 2)
    prefix_only = WeightedScorerRouter(3, config=WeightedConfig(prefix_weight=1, queue_weight=0, kv_weight=0))
    prefix_only.index.insert(block_hashes(prompt(0, 4), BLOCK), 0)
    assert prefix_only.choose(request("c", prompt(0, 4)), loaded).replica == 0   # however loaded


# --- bad input ------------------------------------------------------------------------------------
def test_unknown_policy_names_the_allowed_ones():
    with pytest.raises(ValueError, match="policy='fastest'; must be one of round_robin, random"):
        ClusterConfig(2, "fastest")
    with pytest.raises(ValueError, match="cache_aware"):
        make_router("nope", 2)


def test_zero_replicas_and_bad_parameters_are_refused():
    with pytest.raises(ValueError, match=r"num_replicas=0; must be an int >= 1"):
        ClusterConfig(0)
    with pytest.raises(ValueError, match=r"cache_threshold=1.5; must be in \[0, 1\]"):
        ClusterConfig(2, "cache_aware", {"cache_threshold": 1.5})
    with pytest.raises(ValueError, match="policy 'round_robin' takes no parameters"):
        ClusterConfig(2, "round_robin", {"x": 1})
    with pytest.raises(ValueError, match="WeightedConfig"):
        ClusterConfig(2, "weighted", {"prefix": 1})
    with pytest.raises(ValueError, match=r"replica=5; must be an int in 0..1"):
        Cluster(ClusterConfig(2), spec()).kill(5, 1.0)


# --- the cluster driver ---------------------------------------------------------------------------
def spec(kv_capacity_tokens: int = 6000, **kwargs) -> ReplicaSpec:
    return ReplicaSpec(ROOFLINE, kv_capacity_tokens, **kwargs)


@pytest.fixture(scope="module")
def sessions():
    return make_sessions(SessionShape(120, session_rate=150.0, num_system_prompts=3, system_prompt_len=256,
                                      think_time_s=0.5), seed=1)


@pytest.mark.parametrize("policy", list(ROUTING_POLICIES))
def test_every_request_ends_and_the_fast_path_changes_nothing(policy, sessions):
    results = [Cluster(ClusterConfig(3, policy, seed=2), spec(fast_decode_runs=fast)).run(
        sessions.requests, sessions.session_of) for fast in (True, False)]
    fast, slow = (r.requests_df() for r in results)
    pd.testing.assert_frame_equal(fast, slow)
    assert len(fast) == len(sessions.requests) and set(fast["status"]) == {"finished"}
    assert summary_row(results[0].merged)["num_finished"] == len(sessions.requests)
    assert sum(len(t.requests) for t in results[0].traces) == len(sessions.requests)
    assert sum(t.meta["num_preemptions"] for t in results[0].traces) > 0     # the small caches filled up
    assert sum(t.meta["num_fast_steps"] for t in results[0].traces) > 0


def test_one_replica_is_the_engine_alone(sessions):
    result = Cluster(ClusterConfig(1, "round_robin"), spec()).run(sessions.requests)
    alone = spec().build(0).run(sessions.requests)
    pd.testing.assert_frame_equal(result.traces[0].requests_df(), alone.requests_df())
    assert [(s.start, s.duration) for s in result.traces[0].steps] == [(s.start, s.duration) for s in alone.steps]


def test_predicted_and_actual_hits_are_recorded(sessions):
    cache_aware = Cluster(ClusterConfig(3, "cache_aware"), spec(3000)).run(sessions.requests, sessions.session_of)
    routing = cache_aware.routing
    assert routing["predicted_hit_tokens"].notna().all() and routing["admitted_hit_tokens"].notna().all()
    assert (routing["predicted_hit_tokens"] > routing["cached_at_route_tokens"]).any()   # the tree outlives the cache
    assert (routing["cached_at_route_tokens"] > 0).any()
    hits = cache_aware.hit_summary()
    assert hits["predicted_hit_share"] > hits["cached_at_route_share"] > 0
    kv = Cluster(ClusterConfig(3, "kv_aware"), spec(3000)).run(sessions.requests, sessions.session_of).routing
    assert (kv["predicted_hit_tokens"] == kv["cached_at_route_tokens"]).all()     # KV events are the truth
    blind = Cluster(ClusterConfig(3, "round_robin"), spec(3000)).run(sessions.requests).routing
    assert blind["predicted_hit_tokens"].isna().all()


def test_a_dead_replica_aborts_its_requests_and_the_rest_go_on(sessions):
    cluster = Cluster(ClusterConfig(3, "least_outstanding"), spec())
    t_dead = sessions.requests[len(sessions.requests) // 2].arrival_time
    cluster.kill(replica=1, at=t_dead)
    result = cluster.run(sessions.requests, sessions.session_of)
    df = result.requests_df()
    aborted = df[df["status"] == "aborted"]
    assert len(df) == len(sessions.requests) and len(aborted) > 0
    assert (aborted["replica"] == 1).all()
    assert aborted["finish_detail"].str.startswith(f"replica 1 died at t={t_dead:.6g} s").all()
    assert (df.loc[df["routed_at"] > t_dead, "replica"] != 1).all()
    assert set(df["status"]) == {"finished", "aborted"}
    assert result.traces[1].meta["died_at"] == t_dead
    assert result.merged.meta["num_aborted"] == len(aborted)


def test_with_every_replica_dead_requests_are_rejected_not_lost(sessions):
    cluster = Cluster(ClusterConfig(2, "round_robin"), spec())
    cluster.kill(0, 0.2)
    cluster.kill(1, 0.3)
    df = cluster.run(sessions.requests).requests_df()
    late = df[df["arrival_time"] > 0.3]
    assert len(df) == len(sessions.requests) and len(late) > 0
    assert (late["status"] == "rejected").all()
    assert late["finish_detail"].str.contains("no replica is alive").all()


def test_cluster_runs_any_engine_factory(sessions):
    result = Cluster(ClusterConfig(2, "power_of_two"), engine_factory=lambda i: spec(
                     paged=False, args=EngineArgs(enable_prefix_caching=False)).build(i)).run(sessions.requests)
    assert set(result.requests_df()["status"]) == {"finished"}
    assert (result.routing["cached_at_route_tokens"] == 0).all()


# --- sessions -------------------------------------------------------------------------------------
def test_sessions_share_prefixes_as_the_knobs_say():
    work = make_sessions(SessionShape(20, turns=3, num_system_prompts=2, system_prompt_len=64), seed=4)
    by_id = {r.request_id: r for r in work.requests}
    first, second = by_id["s0003-t00"], by_id["s0003-t01"]
    assert second.prompt_ids[:first.prompt_len] == first.prompt_ids and second.arrival_time >= first.arrival_time
    assert by_id["s0001-t00"].prompt_ids[:64] != by_id["s0002-t00"].prompt_ids[:64]    # prompts 1, 0
    assert by_id["s0000-t00"].prompt_ids[:64] == by_id["s0002-t00"].prompt_ids[:64]
    assert work.session_of["s0003-t01"] == "s0003"
    assert [r.arrival_time for r in work.requests] == sorted(r.arrival_time for r in work.requests)
    assert make_sessions(work.shape, seed=4).requests == work.requests
    none = make_sessions(SessionShape(20, turns=1, num_system_prompts=20), seed=4)
    assert ideal_prefix_reuse(none.requests) == 0.0
    assert ideal_prefix_reuse(work.requests) > 0.3
    with pytest.raises(ValueError, match="num_sessions=0; must be an int >= 1"):
        SessionShape(0)


# --- sweeps ---------------------------------------------------------------------------------------
POINTS = grid(policy=["round_robin", "cache_aware"], seed=[0, 1])


def test_sweep_rows_are_small_reproducible_and_simulated_once():
    from batchlab.cluster.sweep import _cluster_row
    table = run_sweep(cluster_point, POINTS[:2])
    assert list(table["policy"]) == ["round_robin", "round_robin"] and table["num_finished"].gt(0).all()
    hits = _cluster_row.cache_info().hits
    again = run_sweep(cluster_point, POINTS[:2])             # from the cache: two more hits
    assert _cluster_row.cache_info().hits == hits + 2
    pd.testing.assert_frame_equal(table, again)
    simulated = _cluster_row.__wrapped__("round_robin", 4, 1, 100, 10.0, 4, 256, 20_000, "Llama-3-8B", "H100")
    assert pd.Series(simulated).equals(pd.Series(cluster_point(**POINTS[1])))      # POINTS[1]: the defaults, seed 1
    assert cluster_point(**POINTS[1]) is not cluster_point(**POINTS[1])              # copies: a row's edit stays in it
    with pytest.raises(ValueError, match="returned list"):
        run_sweep(lambda **kw: [1], [{}])
    with pytest.raises(ValueError, match="non-empty list"):
        grid(policy=[])


def test_a_failing_point_is_a_row_and_the_others_go_on(capsys):
    table = run_sweep(cluster_point, [POINTS[0], {"policy": "no_such_policy", "seed": 0}])
    assert table["num_finished"].iloc[0] > 0 and pd.isna(table["error"].iloc[0])
    assert table["error"].iloc[1].startswith("ValueError: policy='no_such_policy'; must be one of")
    assert "1 of 2 points failed" in capsys.readouterr().out


def test_sweep_on_ray_equals_in_process():
    pytest.importorskip("ray")
    points = [*POINTS, {"policy": "no_such_policy", "seed": 0}]        # one failure travels as a row too
    in_process = run_sweep(cluster_point, points)
    t0 = time.perf_counter()
    on_ray = run_sweep(cluster_point, points, use_ray=True, num_cpus=2)
    print(f"sweep of {len(points)} points on an embedded Ray (2 CPUs): {time.perf_counter() - t0:.1f} s")
    pd.testing.assert_frame_equal(in_process, on_ray)
    assert on_ray["error"].notna().sum() == 1


# --- style ----------------------------------------------------------------------------------------
PACKAGE = Path(__file__).resolve().parents[1] / "batchlab"


@pytest.mark.parametrize("path", sorted((PACKAGE / "cluster").glob("*.py")) + [PACKAGE / "workloads" / "sessions.py"],
                         ids=lambda p: p.name)
def test_functions_and_classes_stay_small(path):
    for node in ast.walk(ast.parse(path.read_text())):
        size = node.end_lineno - node.lineno + 1 if hasattr(node, "end_lineno") else 0
        if isinstance(node, ast.FunctionDef):
            assert size <= 40, f"{path.name}: def {node.name} has {size} lines"
        elif isinstance(node, ast.ClassDef):
            assert size <= 200, f"{path.name}: class {node.name} has {size} lines"
