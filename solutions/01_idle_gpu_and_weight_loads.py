"""Worked solutions for notebook 01 (an idle device, and what a decode step costs)."""

import numpy as np


def solve_01_1() -> float:
    """Every weight is read once per step: bytes / bandwidth."""
    weight_bytes = 7e9 * 2                      # parameters x bytes per bf16 parameter
    return weight_bytes / 3.35e12 * 1e3         # about 4.2 ms


def solve_01_2() -> float:
    """Intensity(b) = 2·P·b / (2 bytes · P) = b FLOPs per byte; set it equal to the ridge point."""
    ridge = 989e12 / 3.35e12                    # FLOPs per byte, about 295
    return ridge * 2 / 2                        # b = ridge · bytes per parameter / 2


def per_token_ms(profile, b):
    """Interpolate the step time between measured batch sizes, then share it among b tokens."""
    table = profile.sort_values("batch_size")   # np.interp needs increasing x
    step_ms = np.interp(b, table["batch_size"], table["ms_per_step"])
    return step_ms / b


def solve_01_3():
    return per_token_ms


def solve_01_4() -> tuple[float, float]:
    """Utilization law rho = rate·S, then Pollaczek-Khinchine for the mean wait."""
    rate, service_s, cv2 = 0.5, 1.2, 0.5
    rho = rate * service_s                                       # 0.6: busy 60 % of the time
    wait = rho * service_s * (1 + cv2) / (2 * (1 - rho))         # 1.35 s
    return rho, wait


def _wrong_per_token_ms(profile, b):
    """A common slip: forgetting that the step's time is shared by b tokens."""
    table = profile.sort_values("batch_size")
    return np.interp(b, table["batch_size"], table["ms_per_step"])


SOLUTIONS = {"01.1": solve_01_1, "01.2": solve_01_2, "01.3": solve_01_3, "01.4": solve_01_4}
WRONG = {
    "01.1": 7e9 * 4 / 3.35e12 * 1e3,            # fp32 bytes instead of bf16
    "01.2": 989e12 / 3.35e12 / 2,               # intensity mistaken for 2 FLOPs per byte per sequence
    "01.3": _wrong_per_token_ms,
    "01.4": (0.6, 0.6 * 1.2 / (1 - 0.6)),       # M/M/1's wait instead of the given CV²
}
