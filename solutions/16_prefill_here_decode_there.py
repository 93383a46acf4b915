"""Worked solutions for notebook 16 (prefill here, decode there)."""

from batchlab.cluster import DisaggregatedCluster, DisaggregatedConfig
from batchlab.cluster.pd_goodput import attainment_table, goodput_by_layout
from batchlab.requests import Request
from batchlab.workloads import Range


def solve_16_1() -> float:
    """Run the one request through the cluster and read its first token's time."""
    cluster = DisaggregatedCluster.for_device("Llama-3-8B", "H100", DisaggregatedConfig(1, 1, link="ethernet-100g"))
    record = cluster.run([Request("q", None, 8, arrival_time=0.0, prompt_len=5000)]).merged.requests[0]
    return (record.token_times[0] - record.arrival_time) * 1e3


def solve_16_2() -> str:
    """Sweep every layout of four GPUs and take the one with the highest goodput."""
    table = attainment_table("Llama-3-8B", "H100", 4, range(4, 33, 4), {"ttft": 1.0, "tpot": 0.012},
                             num_requests=200, prompt_len=Range(2000, 4000), output_len=Range(128, 384))
    return str(goodput_by_layout(table, 4)["goodput"].idxmax())


SOLUTIONS = {"16.1": solve_16_1, "16.2": solve_16_2}
WRONG = {"16.1": 1.0, "16.2": "3P1D"}
