"""Checkers for notebook 01 (an idle device, and what a decode step costs)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from batchlab.exercises import Verdict, compare, exercise

# The numbers given in the exercises' text.
PARAMS_7B = 7e9
BF16_BYTES = 2
H100_BANDWIDTH = 3.35e12        # bytes per second
H100_BF16_FLOPS = 989e12        # dense FLOP/s
SERVICE_S, SERVICE_CV2, ARRIVAL_RATE = 1.2, 0.5, 0.5


@exercise("01.1")
def check_bandwidth_floor(answer) -> Verdict:
    """Shortest decode step (ms): weight bytes / bandwidth."""
    expected_ms = PARAMS_7B * BF16_BYTES / H100_BANDWIDTH * 1e3
    return compare(answer, expected_ms, rtol=1e-2, what="floor in ms")


@exercise("01.2")
def check_crossover_batch(answer) -> Verdict:
    """Batch size where 2·P·b / (P·bytes) FLOPs per byte equals peak FLOP/s / bandwidth."""
    ridge = H100_BF16_FLOPS / H100_BANDWIDTH                 # FLOPs per byte
    expected_batch = ridge * BF16_BYTES / 2
    return compare(answer, expected_batch, rtol=2e-2, what="batch size")


def _reference_per_token_ms(profile: pd.DataFrame, b: int) -> float:
    table = profile.sort_values("batch_size")
    step_ms = np.interp(b, table.batch_size.to_numpy(float), table.ms_per_step.to_numpy(float))
    return float(step_ms / b)


def _test_profiles() -> list[pd.DataFrame]:
    """Profiles shaped like a CPU's (steep) and a GPU's (flat), rows deliberately out of order."""
    cpu = pd.DataFrame({"batch_size": [4, 1, 2, 8, 16],
                        "ms_per_step": [61.0, 48.0, 52.5, 79.0, 121.0]})
    gpu = pd.DataFrame({"batch_size": [1, 8, 64, 256, 32],
                        "ms_per_step": [6.1, 6.3, 7.9, 15.5, 7.0]})
    cpu["ms_per_token"] = cpu.ms_per_step / cpu.batch_size
    gpu["ms_per_token"] = gpu.ms_per_step / gpu.batch_size
    return [cpu, gpu]


@exercise("01.3")
def check_per_token_predictor(answer) -> Verdict:
    """A function (profile, b) -> ms per token: linear interpolation of ms_per_step, divided
    by b."""
    if answer is None or answer is ...:
        return compare(None, None, what="function")
    if not callable(answer):
        return Verdict("wrong", "expected a function per_token_ms(profile, b), got a "
                                f"{type(answer).__name__}")
    cases = [(p, b) for p, bs in zip(_test_profiles(), ([1, 3, 6, 8, 12, 16], [1, 4, 48, 100, 256]))
             for b in bs]
    try:
        got = [float(answer(p.copy(), b)) for p, b in cases]
    except Exception as err:   # the learner's code may fail in any way; say how
        return Verdict("wrong", f"your function raised {type(err).__name__}: {err}")
    expected = [_reference_per_token_ms(p, b) for p, b in cases]
    verdict = compare(got, expected, rtol=1e-6, what="predictions")
    if not verdict.ok:
        worst = int(np.argmax(np.abs(np.array(got) - np.array(expected))))
        p, b = cases[worst]
        return Verdict("wrong", f"for batch {b} on a profile with sizes {sorted(p.batch_size)} "
                                f"expected {expected[worst]:.3f} ms per token, got "
                                f"{got[worst]:.3f}")
    return verdict


@exercise("01.4")
def check_busy_and_wait(answer) -> Verdict:
    """(busy share, mean wait s): utilization law and Pollaczek-Khinchine."""
    rho = ARRIVAL_RATE * SERVICE_S
    wait = rho * SERVICE_S * (1 + SERVICE_CV2) / (2 * (1 - rho))
    return compare(answer, (rho, wait), rtol=1e-2, what="(busy share, mean wait)")
