"""Fit each measured GPU's kernel efficiencies to data/gpu_kernels/ and store them in the presets.

    .venv/bin/python scripts/fit_gpu_presets.py            # fit, print, rewrite batchlab/steptime/device_presets.json
    .venv/bin/python scripts/fit_gpu_presets.py --check    # fit and compare with the file; exit 1 if they differ

Every ``data/gpu_kernels/<gpu>_<model>.csv`` (Vidur's measured per-layer kernel times) belongs to
the device its name starts with; each device is fitted on all its files together, on its
datasheet's roofs and SM count (``batchlab.steptime.kernel_fit``: small operators, then achieved
bandwidth and the fixed cost per kernel from the memory-bound rows, then achieved compute, the
transition's exponent and the matrix multiplies' output tile from every row). The transition is
fitted twice, as a smooth maximum (exponent fitted) and as a hard maximum (exponent 32, same
tile), and both errors are stored, so the file says why the smooth one is used.
Only the fitted devices' ``kernels`` and the ``kernel_fit`` record are rewritten; devices without
measurements keep their stated assumption (``"like": ...``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batchlab.steptime.device_presets import DEVICE_PRESETS_PATH, load_device_presets  # noqa: E402
from batchlab.steptime.kernel_fit import MEMORY_BOUND_TOKENS, TILE_CANDIDATES, TILE_COLS, fit_device  # noqa: E402
from batchlab.steptime.kernel_profiles import KERNEL_PROFILES_DIR, compare_profile, error_summary, guess_device, \
    read_kernel_profile  # noqa: E402
from batchlab.steptime.kernels import MMA_ROWS, SPLIT_K_MAX_SLICES, SPLIT_K_MIN_DEPTH, \
    KernelEfficiency  # noqa: E402

HARD_MAX_P = 32.0
METHOD = [
    "one kernel: latency + ((bytes / (bandwidth_fraction * bandwidth))^p "
    "+ (flops / (compute_fraction * peak))^p)^(1/p); one layer: its four matrix multiplies (qkv, o, gate+up, down, each GPU holding 1/tp) and five small operators "
    "(two norms, rope, activation, add: small_op_latency + bytes / (small_op_bandwidth_fraction * bandwidth))",
    "a matrix multiply's flops are its tiles' (tile and wave quantization, the same formula for every device, "
    "projection and tensor-parallel degree): rows (tokens) padded up to a multiple of tile_rows (fewer than one "
    f"tile: to the next power of two, at least {MMA_ROWS}, the rows of one tensor-core MMA), columns (output features) "
    "to a multiple of tile_cols; tiles = ceil(rows / tile height) * ceil(n / tile_cols) run in waves of num_sms "
    "(the device's SM count, from NVIDIA's whitepapers), rounded up to whole waves, with the K loop split into the "
    f"s <= min({SPLIT_K_MAX_SLICES}, k / {SPLIT_K_MIN_DEPTH}) slices that round up least (an assumption); "
    "flops = 2 * k * waves * num_sms * tile height * tile_cols; the bytes stay the real ones",
    "small operators: least squares in relative error over every row",
    f"bandwidth_fraction and matmul_latency: least squares in relative error over the memory-bound rows "
    f"(<= {MEMORY_BOUND_TOKENS} tokens, every tensor-parallel degree)",
    "compute_fraction and transition_p: least squared log error of the whole layer over every row (1-4,096 tokens), "
    "on a grid refined around its best point, for each tile (tile_rows x tile_cols) of "
    f"{', '.join(f'{r}x{c}' for r, c in TILE_CANDIDATES)}; the tile with the least error is kept (tile_rows fitted "
    f"on the shipped files only; tile_cols = {TILE_COLS} stated: the common bf16 CTA tile width of CUTLASS and "
    "cuBLAS on Ampere and Hopper, an assumption)",
]


def profiles_by_device(devices) -> dict[str, dict[str, object]]:
    grouped: dict[str, dict[str, object]] = {}
    for path in sorted(KERNEL_PROFILES_DIR.glob("*.csv")):
        grouped.setdefault(guess_device(path, devices), {})[path.name] = read_kernel_profile(path)
    return grouped


def kernels_entry(eff: KernelEfficiency, stats: dict, tables: dict) -> dict:
    rows = sum(s["rows"] for s in stats.values())
    tps = sorted({int(tp) for t in tables.values() for tp in t["tensor_parallel"].unique()})
    return {"bandwidth_fraction": round(eff.bandwidth_fraction, 4), "compute_fraction": round(eff.compute_fraction, 4),
            "transition_p": round(eff.transition_p, 3), "matmul_latency_us": round(eff.matmul_latency_s * 1e6, 3),
            "small_op_bandwidth_fraction": round(eff.small_op_bandwidth_fraction, 4),
            "small_op_latency_us": round(eff.small_op_latency_s * 1e6, 3),
            "tile_rows": eff.tile_rows, "tile_cols": eff.tile_cols,
            "source": f"fitted by scripts/fit_gpu_presets.py to data/gpu_kernels/{', '.join(tables)} (Vidur's "
                      f"measured kernel times, MIT License): {rows} rows, 1-4,096 tokens, tensor parallel "
                      f"{', '.join(map(str, tps))}",
            "fit": {name: {"rows": s["rows"], "median_error": round(s["median_error"], 4),
                           "worst_error": round(s["worst_error"], 4)} for name, s in stats.items()}}


def held_out(presets, grouped: dict, fitted: dict) -> dict[str, str]:
    """Errors on data a fit did not see: each file from its device's other files, and each device's
    files with another device's fractions applied to its own datasheet (what H200, L4, T4 rest on)."""
    checks = {}
    for device, tables in grouped.items():
        preset = presets[device]
        for name in (tables if len(tables) > 1 else []):
            rest = {n: t for n, t in tables.items() if n != name}
            eff, _ = fit_device(rest, preset.memory_bandwidth_Bps, preset.peak_flops, preset.dtype_bytes,
                                num_sms=preset.num_sms)
            median, worst = error_summary(compare_profile(tables[name], replace(preset, kernels=eff).kernel_model()))
            checks[f"{device} fitted on {', '.join(rest)}, checked on {name}"] = \
                f"median {median:.1%}, worst {worst:.1%}"
        for other, eff in fitted.items():
            if other == device:
                continue
            model = replace(preset, kernels=eff).kernel_model()
            for name, table in tables.items():
                median, worst = error_summary(compare_profile(table, model))
                checks[f"{name} with {other}'s fitted kernels on {device}'s datasheet"] = \
                    f"median {median:.1%}, worst {worst:.1%}"
    return checks


def fit_all(data: dict) -> tuple[dict, dict, dict]:
    """Each measured device's ``kernels`` entry, the comparison of the two transitions, and the
    held-out checks."""
    presets = load_device_presets()
    grouped = profiles_by_device(presets)
    entries, transitions, fitted = {}, {}, {}
    for device, tables in grouped.items():
        preset = presets[device]
        args = (tables, preset.memory_bandwidth_Bps, preset.peak_flops, preset.dtype_bytes)
        eff, stats = fit_device(*args, num_sms=preset.num_sms)
        _, hard = fit_device(*args, transition_p=HARD_MAX_P, num_sms=preset.num_sms,
                             tile=(eff.tile_rows, eff.tile_cols))
        entries[device], fitted[device] = kernels_entry(eff, stats, tables), eff
        transitions[device] = {
            name: {file: f"median {s['median_error']:.1%}, worst {s['worst_error']:.1%}" for file, s in st.items()}
            for name, st in (("smooth maximum, p fitted", stats), (f"hard maximum (p = {HARD_MAX_P:g})", hard))}
        print(f"{device}: {json.dumps({k: v for k, v in entries[device].items() if k not in ('source', 'fit')})}")
        for name, per_file in transitions[device].items():
            print(f"  {name}: " + "; ".join(f"{f} {v}" for f, v in per_file.items()))
    checks = held_out(presets, grouped, fitted)
    for what, result in checks.items():
        print(f"held out: {what}: {result}")
    return entries, transitions, checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare a fresh fit with the presets file")
    args = parser.parse_args()
    data = json.loads(DEVICE_PRESETS_PATH.read_text())
    entries, transitions, checks = fit_all(data)
    for device, entry in entries.items():
        data["devices"][device]["kernels"] = entry
    data["kernel_fit"] = {"script": "scripts/fit_gpu_presets.py", "data": "data/gpu_kernels/", "method": METHOD,
                          "transition": transitions, "held_out": checks}
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    if args.check:
        same = text == DEVICE_PRESETS_PATH.read_text()
        print("the presets file matches a fresh fit" if same else "the presets file differs from a fresh fit")
        return 0 if same else 1
    DEVICE_PRESETS_PATH.write_text(text)
    print(f"wrote {DEVICE_PRESETS_PATH.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
