"""batchlab.predict.recommend: the cheapest deployments meeting an SLO, searched."""

import re

import pytest

from batchlab.predict import Deployment, EngineArgs, TrafficSpec, predict
from batchlab.predict.__main__ import main as cli
from batchlab.predict.recommend import SLO, every_rth, recommend

TRAFFIC = TrafficSpec(300, 12.0, input_len=600, output_len=120, seed=3).generate()


@pytest.fixture(scope="module")
def searched():
    return recommend("Llama-3-8B", ["H100"], TRAFFIC, SLO(ttft_ms=400, tpot_ms=20), max_gpus=4, top=3)


def test_every_recommendation_meets_the_slo_when_predicted_again(searched):
    table, search = searched
    assert search["predictions"] >= 10 and len(table) >= 1
    assert (table[["ttft_margin", "tpot_margin"]] >= 0).all().all() and set(table["layout"]) == {"replicas"}
    assert list(table["gpu_hours_per_M_tokens"]) == sorted(table["gpu_hours_per_M_tokens"])
    best = table.iloc[0]
    flags = EngineArgs(int(best.max_num_seqs), int(best.max_num_batched_tokens))
    r = predict(Deployment("Llama-3-8B", "H100", int(best.tp), int(best.replicas), flags), TRAFFIC,
                (50, 99)).bench_result()
    assert r["p99_tpot_ms"] < 20 and r["p99_ttft_ms"] < 400


def test_a_tighter_slo_never_needs_fewer_gpus(searched):
    tight, _ = recommend("Llama-3-8B", ["H100"], TRAFFIC, SLO(ttft_ms=400, tpot_ms=8), max_gpus=4, top=3)
    assert tight.iloc[0].num_gpus >= searched[0].iloc[0].num_gpus
    assert tight.iloc[0].tpot_p99_ms < 8


def test_one_replica_s_share_is_every_rth_request():
    share = every_rth(TRAFFIC, 3)
    assert len(share) == 100 and share.arrival_s[1] == TRAFFIC.arrival_s[3]


@pytest.mark.parametrize("extra, message", [
    ([], r"slo_ttft_ms=None; must be a bound, or slo_tpot_ms one"),
    (["--slo-tpot-ms", "5", "--slo-percentile", "100"], r"percentile=100.0; must be a number in \(0, 100\)"),
    (["--slo-tpot-ms", "0.5", "--max-gpus", "2"], r"slo='TPOT p99 < 0.5 ms'; must be met by some deployment"),
    (["--slo-tpot-ms", "50", "--gpu-hour-usd", "H100=cheap"], r"gpu_hour_usd='H100=cheap'; must be GPU=dollars"),
    (["--slo-tpot-ms", "50", "--gpu", "H100,B300"], r"gpu='B300'; must be one of"),
    (["--slo-tpot-ms", "50", "--pd-link", "carrier-pigeon"], r"carrier-pigeon"),
    (["--slo-tpot-ms", "50", "--model", "GPT-5"], r"GPT-5"),
])
def test_bad_searches_end_in_one_line(extra, message, capsys):
    argv = ["--recommend", "--model", "Llama-3-8B", "--gpu", "H100", "--request-rate", "10", "--num-prompts", "50"]
    assert cli(argv + extra) == 2, extra
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert re.search(message, err), err


def test_prefill_decode_splits_join_the_search_and_meet_the_slo():
    from batchlab.predict import predict_disaggregated

    long_prompts = TrafficSpec(120, 6.0, input_len=3000, output_len=60, seed=4).generate()
    slo = SLO(ttft_ms=1500, tpot_ms=25)
    table, _ = recommend("Llama-3-8B", ["H100"], long_prompts, slo, max_gpus=3, top=10, pd_link="nvlink4")
    assert set(table["layout"]) >= {"replicas"}
    splits = table[table["layout"].str.startswith("P/D")]
    assert len(splits) >= 1, table
    first = splits.iloc[0]
    num_prefill, num_decode = (int(x) for x in first.layout.split()[1].split(":"))
    d = Deployment("Llama-3-8B", "H100", int(first.tp))
    r = predict_disaggregated(d, d, num_prefill, num_decode, long_prompts, "nvlink4", (50, 99)).bench_result()
    assert r["p99_ttft_ms"] < 1500 and r["p99_tpot_ms"] < 25


def test_capacity_bisects_to_the_highest_rate_under_the_slo():
    from batchlab.predict.planning import capacity, meets_slo, run_at

    def traffic_at(rate: float) -> TrafficSpec:
        return TrafficSpec(int(rate * 10) + 1, rate, input_len=600, output_len=120, seed=2)

    d, slo = Deployment("Llama-3-8B", "H100"), {"tpot_p90_ms": 9.0}
    found = capacity(d, traffic_at, slo, low=1.0, high=200.0, tolerance=0.05)
    assert not found["capped"] and found["rate"] > 1 and meets_slo(found, slo)
    assert not meets_slo(run_at(d, traffic_at, found["rate"] * 1.15), slo)
    assert capacity(d, traffic_at, {"tpot_p90_ms": 0.5})["rate"] == 0.0


def test_a_bracketed_capacity_search_finds_the_same_rate():
    from batchlab.predict.planning import capacity

    def traffic_at(rate: float) -> TrafficSpec:
        return TrafficSpec(int(rate * 10) + 1, rate, input_len=600, output_len=120, seed=2)

    d, slo = Deployment("Llama-3-8B", "H100"), {"tpot_p90_ms": 9.0}
    plain = capacity(d, traffic_at, slo, low=4.0, high=64.0, tolerance=0.05)
    known = capacity(d, traffic_at, slo, low=4.0, high=64.0, tolerance=0.05, bracketed=True)
    assert known["rate"] == pytest.approx(plain["rate"]) and known["runs"] == plain["runs"] - 2


def test_a_rate_sweep_predicts_each_deployment_and_traffic_once_and_hands_out_copies():
    from batchlab.predict.planning import _predicted, run_at, sweep_rates

    def traffic_at(rate: float) -> TrafficSpec:
        return TrafficSpec(int(rate * 5) + 1, rate, input_len=300, output_len=40, seed=4)

    d = Deployment("Llama-3-8B", "H100")
    _predicted.cache_clear()
    row = run_at(d, traffic_at, 6.0)
    row["ttft_p50_ms"] = -1.0                                    # a caller's edit stays in its row
    table = sweep_rates({"a": d, "b": Deployment("Llama-3-8B", "H100", 2)}, traffic_at, [6.0, 9.0])
    assert _predicted.cache_info().hits == 1 and _predicted.cache_info().misses == 4
    assert table.loc[0, "ttft_p50_ms"] > 0 and table.loc[0, "rate"] == 6.0
    fresh = predict(d, traffic_at(6.0).generate()).bench_result()  # what an uncached run predicts
    assert table.loc[0, "ttft_p50_ms"] == fresh["median_ttft_ms"]
    shifted = run_at(d, lambda rate: TrafficSpec(int(rate * 5) + 1, rate, input_len=300, output_len=40, seed=5), 6.0)
    assert _predicted.cache_info().misses == 5 and shifted["ttft_p50_ms"] != table.loc[0, "ttft_p50_ms"]
