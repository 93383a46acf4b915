"""Run-to-run spread of notebook 13's knob measurements: the notebook, run whole several times.

Notebook 13 predicts, on the simulator, what each of vLLM's knobs does to a ratio a tuner acts on
(throughput of 128 sequences over 2, uncached TTFT over cached, ...), then measures the ratio on
vLLM. How close a prediction must come is set *before* measuring, from how much the measured
ratio itself moves between separate runs (each with its own server starts, calibration and
loads). This script measures that: it executes the notebook ``--runs`` times, one after the
other, and after each run reads every knob's predicted and measured ratio from the kernel
(the notebook's ``findings`` table). It writes them, with the machine and the load average
around each run, to ``data/vllm_tuning/run_to_run.json``, which the notebook reads.

    .venv/bin/python scripts/measure_vllm_spread.py --runs 4        # some 10 minutes a run on 2 cores

A run whose knob checks fail still counts (its ratios are what was measured); a run that does not
reach the ``findings`` table (vLLM not set up, a server that did not start) stops the script.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "13_tuning_vllm.ipynb"
OUT = ROOT / "data" / "vllm_tuning" / "run_to_run.json"
MARK = "RUN_TO_RUN "
READ_BACK = ("import json\n"
             "print('RUN_TO_RUN ' + json.dumps({knob: {'predicted': float(row['predicted']), "
             "'measured': float(row['measured'])} for knob, row in findings.iterrows()}))")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_once(notebook: Path, timeout_s: int) -> dict:
    """Execute the notebook once; return its knobs' ratios, the wall time and the load around it."""
    nb = nbformat.read(notebook, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(READ_BACK))
    load_before, t0 = os.getloadavg()[0], time.time()
    NotebookClient(nb, timeout=timeout_s, allow_errors=True, resources={"metadata": {"path": str(ROOT / "notebooks")}},
                   kernel_name="python3").execute()
    failed = [o["evalue"].splitlines()[0] for c in nb.cells if c.cell_type == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    last = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []) if o.get("output_type") == "stream")
    if MARK not in last:
        raise SystemExit(f"the run did not reach the findings table; its errors: {failed}")
    ratios = json.loads(last.split(MARK, 1)[1].strip())
    return {"ratios": ratios, "wall_s": round(time.time() - t0, 1), "load_before": round(load_before, 2),
            "load_after": round(os.getloadavg()[0], 2), "failed_checks": failed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4, help="how many whole runs of the notebook (default 4)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds allowed per cell (default 900)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"where to write (default {OUT.relative_to(ROOT)})")
    parser.add_argument("--append", action="store_true", help="add to the runs already in --out")
    parser.add_argument("--notebook", type=Path, default=NOTEBOOK, help="the built notebook to run (default: 13's)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: must be at least 1")
    runs = json.loads(args.out.read_text())["runs"] if args.append and args.out.exists() else []
    for i in range(args.runs):
        run = run_once(args.notebook, args.timeout)
        run["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
        runs.append(run)
        print(f"run {i + 1}/{args.runs}: {run['wall_s']:.0f} s, load {run['load_before']}-{run['load_after']}, "
              f"measured {({k: round(v['measured'], 3) for k, v in run['ratios'].items()})}", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "what": "notebook 13's knob ratios, predicted and measured, over whole separate runs of the notebook "
                    "(scripts/measure_vllm_spread.py)",
            "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "python": sys.version.split()[0]},
            "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
