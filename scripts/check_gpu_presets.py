"""Measured kernel times of a profile file against a GPU preset's prediction, per token count.

    .venv/bin/python scripts/check_gpu_presets.py data/gpu_kernels/h100_Llama-2-7b-hf.csv
    .venv/bin/python scripts/check_gpu_presets.py FILE.csv --device A100 --max-tokens 4096

FILE is any profile in Vidur's format (``data/gpu_kernels/README.md``): the layer is built from
the file's shape columns, and each row's tensor-parallel degree splits its projections (each GPU
holds 1/tp of them). For every token count the script prints one layer's measured milliseconds
(the four projections and the five small operators), the preset's prediction and the error, one
column group per tensor-parallel degree; then each degree's median and worst error; its last line
is ``median error N%, worst error M%`` over every row up to ``--max-tokens``. The device comes from
the file name (``a100_...``) unless ``--device`` names it. Bad input ends with one line saying
what is wrong and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batchlab.steptime.device_presets import load_device_presets  # noqa: E402
from batchlab.steptime.kernel_profiles import MAX_TOKENS, compare_profile, error_summary, guess_device, \
    layer_shape_of, read_kernel_profile  # noqa: E402
from batchlab.checks import check_int  # noqa: E402


def table_lines(compared) -> list[str]:
    """One line per token count, a measured / predicted / error group per tensor-parallel degree."""
    wide = compared.pivot(index="num_tokens", columns="tensor_parallel")
    tps = sorted(compared["tensor_parallel"].unique())
    head = f"{'tokens':>7}" + "".join(f" | tp {tp}: measured predicted  error" for tp in tps)
    lines = [head, "-" * len(head)]
    for tokens, row in wide.iterrows():
        cells = "".join(f" | {row[('measured_ms', tp)]:8.4f} ms {row[('predicted_ms', tp)]:7.4f} ms "
                        f"{row[('error', tp)]:+6.1%}" if row[("measured_ms", tp)] == row[("measured_ms", tp)]
                        else " |" + " " * 32 for tp in tps)
        lines.append(f"{tokens:7d}{cells}")
    return lines


def check(path: str, device: str | None, max_tokens: int) -> list[str]:
    check_int("max_tokens", max_tokens)
    table = read_kernel_profile(path)
    layer = layer_shape_of(table)
    presets = load_device_presets()
    device = guess_device(path, presets) if device is None else device
    if device not in presets:
        raise ValueError(f"device={device!r}; must be one of {sorted(presets)}")
    compared = compare_profile(table, presets[device].kernel_model(), max_tokens)
    lines = [f"{Path(path).name}: one layer of {layer} on {device}, 1-{max_tokens:,} tokens",
             f"{device}'s kernels: {presets[device].kernels_source}", ""]
    lines += table_lines(compared) + [""]
    for tp, group in compared.groupby("tensor_parallel"):
        median, worst = error_summary(group)
        at = int(group.loc[group["error"].abs().idxmax(), "num_tokens"])
        lines.append(f"tensor parallel {tp}: median error {median:.1%}, worst error {worst:.1%} (at {at:,} tokens)")
    median, worst = error_summary(compared)
    return lines + [f"median error {median * 100:.1f}%, worst error {worst * 100:.1f}%"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("file", help="a profile CSV in Vidur's format (data/gpu_kernels/*.csv)")
    parser.add_argument("--device", help="a preset's name (A100, H100, H200, L4, T4); default: from the file name")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="largest token count compared (4096)")
    args = parser.parse_args(argv)
    try:
        lines = check(args.file, args.device, args.max_tokens)
    except ValueError as err:
        print(f"check_gpu_presets.py: {err}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
