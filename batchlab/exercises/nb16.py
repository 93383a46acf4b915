"""Checkers for notebook 16 (prefill here, decode there).

16.1 runs one request through a 1P1D cluster (instant); 16.2 sweeps four layouts of four GPUs
(a few seconds, once per session: cached).
"""

from __future__ import annotations

from functools import lru_cache

from batchlab.exercises import Verdict, compare, exercise

MODEL, GPU = "Llama-3-8B", "H100"
SWEEP_RATES = tuple(range(4, 33, 4))


def first_token_ms() -> float:
    """16.1: milliseconds from arrival to the first token of a lone 5,000-token prompt, 1P1D,
    100 GbE."""
    from batchlab.cluster import DisaggregatedCluster, DisaggregatedConfig
    from batchlab.requests import Request
    cluster = DisaggregatedCluster.for_device(MODEL, GPU,
                                              DisaggregatedConfig(1, 1, link="ethernet-100g"))
    (record,) = cluster.run([Request("q", None, 8, arrival_time=0.0,
                                     prompt_len=5000)]).merged.requests
    return (record.token_times[0] - record.arrival_time) * 1e3


@lru_cache(maxsize=1)
def best_layout_of_four() -> str:
    """16.2: the layout of four GPUs with the highest goodput for the notebook's long prompts."""
    from batchlab.cluster.pd_goodput import attainment_table, goodput_by_layout
    from batchlab.workloads import Range
    table = attainment_table(MODEL, GPU, 4, SWEEP_RATES, {"ttft": 1.0, "tpot": 0.012},
                             num_requests=200,
                             prompt_len=Range(2000, 4000), output_len=Range(128, 384))
    return str(goodput_by_layout(table, 4)["goodput"].idxmax())


@exercise("16.1")
def check_16_1(answer) -> Verdict:
    return compare(answer, first_token_ms(), rtol=0.01, what="time to first token in milliseconds")


@exercise("16.2")
def check_16_2(answer) -> Verdict:
    if answer is None or answer is ...:
        return Verdict("not attempted", "set answer to a layout's name and run the cell again")
    from batchlab.cluster.pd_goodput import layouts
    if answer not in layouts(4):
        return Verdict("wrong", f"expected one of {layouts(4)}, got {answer!r}")
    best = best_layout_of_four()
    return Verdict("correct", f"{best} carries the most") if answer == best else Verdict(
        "wrong", f"another layout carries more than {answer}")
