"""Checkers for notebook 06 (prefill stalls and chunked prefill).

06.1 is arithmetic from the scheduler's rules; 06.2 and 06.3 run the experiment on a simulator
with a fixed cost model (so the expected answers do not depend on the machine).
"""

from __future__ import annotations

import math

from batchlab.exercises import Verdict, compare, exercise

# 06.1: six decodes beside a 500-token prompt, budget 48.
NUM_RUNNING_1, PROMPT_LEN_1, BUDGET_1 = 6, 500, 48
# 06.2: the cost model, the latency target and the budgets to choose from.
COST_2 = dict(fixed_s=0.040, per_seq_s=0.004, per_token_s=0.0006, per_attention_pair_s=2e-8)
ITL_TARGET_2 = 0.110
BUDGETS_2 = (16, 32, 48, 64, 96, 128, 192, 256, 512)


@exercise("06.1")
def check_prefill_steps(answer) -> Verdict:
    """Decodes take one token each first; the prompt gets the rest of the budget every step."""
    per_step = BUDGET_1 - NUM_RUNNING_1
    return compare(answer, math.ceil(PROMPT_LEN_1 / per_step), what="number of prefill steps")


def _stall_sweep(budgets):
    """The default StallScenario on the 06.2 simulator, one row per budget."""
    from batchlab.sim import SimBackend
    from batchlab.steptime.cost_model import CostModel
    from batchlab.experiments.prefill_stall import StallScenario, budget_sweep

    scenario = StallScenario()
    sim = SimBackend(CostModel(**COST_2), kv_capacity_tokens=8 * scenario.max_seq_len)
    return budget_sweep(sim, scenario.requests(), budgets, scenario.max_num_seqs,
                        long_id=scenario.long_id)


@exercise("06.2")
def check_budget_for_target(answer) -> Verdict:
    """The largest budget whose running requests' worst gap stays within the target."""
    sweep = _stall_sweep(BUDGETS_2)
    ok = sweep.loc[sweep["running_itl_max"] <= ITL_TARGET_2, "max_num_batched_tokens"]
    return compare(answer, int(ok.max()), what="token budget")


@exercise("06.3")
def check_worst_running_gap(answer) -> Verdict:
    """Run the learner's function on two traces (a stalled one and a chunked one)."""
    if answer is None or answer is ...:
        return Verdict("not attempted", "set answer = worst_running_gap and run the cell again")
    if not callable(answer):
        return Verdict("wrong", "expected a function (trace, long_id) -> seconds, got "
                                f"{type(answer).__name__}")
    from batchlab.experiments.prefill_stall import stall_summary

    sweep = _stall_sweep([64, 512])
    long_id = "long000"
    for budget, trace in sweep.attrs["traces"].items():
        expected = float(stall_summary(trace, long_id)["running_itl_max"])
        try:
            got = answer(trace, long_id)
        except Exception as err:  # the learner's code: report, do not crash the notebook
            return Verdict("wrong", f"your function raised {type(err).__name__}: {err}")
        verdict = compare(got, expected, rtol=1e-9, what=f"worst gap at budget {budget}")
        if not verdict.ok:
            return verdict
    return Verdict("correct", "matches stall_summary on a stalled and a chunked run")
