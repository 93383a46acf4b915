"""Regenerate the small workload files in data/ (deterministic: rerunning gives identical files).

    python scripts/make_workloads.py            # writes data/*.jsonl
    python scripts/make_workloads.py --out DIR  # writes them elsewhere (e.g. to compare)

Each file stores lengths and arrival times only, never token ids, so it works with any
tokenizer: ``load_workload(path, tokenizer=tok)`` rebuilds each prompt from data/corpus.txt,
seeded by the request id. Each file's header records the arguments that made it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from batchlab.workloads import make_workload, save_workload

DATA_DIR = Path(__file__).resolve().parent.parent / "data"

# file name -> make_workload arguments. CPU workloads are small enough for the real model on
# 2 cores; "full" workloads hold simulated lengths for the simulator.
WORKLOADS: dict[str, dict] = {
    "chat_poisson_cpu.jsonl": dict(n=24, preset="chat", scale="cpu", arrival="poisson",
                                   rate=2.0, seed=1),
    "prefill_heavy_cpu.jsonl": dict(n=16, preset="prefill_heavy", scale="cpu",
                                    arrival="poisson", rate=1.0, seed=2),
    "decode_heavy_cpu.jsonl": dict(n=16, preset="decode_heavy", scale="cpu",
                                   arrival="poisson", rate=1.0, seed=3),
    "mixed_output_cpu.jsonl": dict(n=16, preset="mixed_output", scale="cpu", arrival="at_once",
                                   seed=4),
    "chat_poisson_full.jsonl": dict(n=500, preset="chat", scale="full", arrival="poisson",
                                    rate=8.0, seed=5),
    # Same seed and rate as chat_poisson_full: identical requests, only the clumping differs.
    "bursty_chat_full.jsonl": dict(n=500, preset="chat", scale="full", arrival="gamma",
                                   rate=8.0, burstiness=0.25, seed=5),
}


def write_workloads(out_dir: Path = DATA_DIR) -> list[Path]:
    """Write every workload in ``WORKLOADS`` to ``out_dir`` and return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, args in WORKLOADS.items():
        requests = make_workload(**args)
        meta = {"made_by": "scripts/make_workloads.py", "make_workload": args}
        paths.append(save_workload(requests, out_dir / name, meta=meta))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DATA_DIR, help="output folder (default: data/)")
    args = parser.parse_args()
    for path in write_workloads(args.out):
        print(f"{path}  ({path.stat().st_size / 1024:.1f} KB)")


if __name__ == "__main__":
    main()
