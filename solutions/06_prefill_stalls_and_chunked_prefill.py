"""Worked solutions for notebook 06 (prefill stalls and chunked prefill), found on the simulator."""

import numpy as np

from batchlab.sim import SimBackend
from batchlab.steptime.cost_model import CostModel
from batchlab.engine import Engine
from batchlab.experiments.prefill_stall import StallScenario, budget_sweep, stall_summary
from batchlab.schedulers import ContinuousBatcher

CPU_LIKE = CostModel(fixed_s=0.040, per_seq_s=0.004, per_token_s=0.0006, per_attention_pair_s=2e-8)


def solve_06_1() -> int:
    """By hand: each step serves the 6 decodes first (6 tokens), leaving 48 - 6 = 42 for the
    prompt; 500 / 42 = 11.9, so 12 steps (eleven of 42 tokens and a last one of 38).
    The simulator agrees (any cost model gives the same plan)."""
    scenario = StallScenario(num_running=6, long_prompt_len=500)
    sim = SimBackend(CPU_LIKE, kv_capacity_tokens=8 * scenario.max_seq_len)
    scheduler = ContinuousBatcher(max_num_seqs=scenario.max_num_seqs, max_num_batched_tokens=48)
    trace = Engine(scheduler, sim).run(scenario.requests())
    return int(stall_summary(trace, scenario.long_id)["long_prefill_steps"])


def solve_06_2() -> int:
    """Sweep the budgets and keep the largest whose worst gap is within 110 ms. With this cost
    model a step of 4 decodes and a 60-token chunk takes about 99 ms, and one with a 92-token
    chunk about 118 ms: the answer is 64."""
    scenario = StallScenario()
    sim = SimBackend(CPU_LIKE, kv_capacity_tokens=8 * scenario.max_seq_len)
    sweep = budget_sweep(sim, scenario.requests(), [16, 32, 48, 64, 96, 128, 192, 256, 512],
                         scenario.max_num_seqs, long_id=scenario.long_id)
    return int(sweep.loc[sweep["running_itl_max"] <= 0.110, "max_num_batched_tokens"].max())


def worst_running_gap(trace, long_id: str) -> float:
    """The largest gap between successive visible tokens of any request but ``long_id``."""
    gaps = [np.diff(r.visible_token_times) for r in trace.requests
            if r.request_id != long_id and len(r.visible_token_times) > 1]
    return float(max(g.max() for g in gaps))


def solve_06_3():
    return worst_running_gap


def _gap_including_the_newcomer(trace, long_id: str) -> float:
    """Wrong on purpose: counts the long request's own gaps too (and its prefill as a gap)."""
    return float(max(np.diff([0.0] + list(r.visible_token_times)).max() for r in trace.requests))


SOLUTIONS = {"06.1": solve_06_1, "06.2": solve_06_2, "06.3": solve_06_3}
WRONG = {
    "06.1": 11,                            # 500 / 48 rounded up: forgets the six decodes
    "06.2": 96,                            # the first budget that breaks the target
    "06.3": _gap_including_the_newcomer,
}
