"""Measure whether serving prompts in one batch changes their greedy answers, per dtype.

    .venv/bin/python scripts/measure_divergence.py [--dtypes float32 bfloat16] [--tokens 48]
        [--prompts 8] [--out data/divergence]

For each dtype: the course's model, the first ``--prompts`` chat questions below, each served
alone and all together in one batch (``batchlab.model.divergence``), ``--tokens`` greedy tokens.
Writes ``<out>/<device>.json`` (device and dtypes in the file) so that notebook 04 can show the
measurement of a device where running it live would take too long (bf16 on a CPU without bf16
instructions is emulated: on the course's 2-core AVX2 VM the 8 x 48 run took about 10 minutes).
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path

import torch

from batchlab.model import load_model
from batchlab.model.divergence import compare_alone_and_together
from batchlab.model.environment import device_name, device_slug
from batchlab.model.llama import LlamaWeights

QUESTIONS = ["What is the capital of France?", "Name a primary color.", "What is 2 + 2?",
             "Why is the sky blue?", "Give me a word that rhymes with cat.",
             "Explain photosynthesis briefly.", "Write a haiku about rain.", "What is a prime number?"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                        choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--prompts", type=int, default=8, choices=range(1, len(QUESTIONS) + 1))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default="data/divergence")
    args = parser.parse_args()

    runs = {}
    for dtype in args.dtypes:
        lm = load_model(device=args.device, dtype=dtype)
        weights = LlamaWeights.from_hf(lm.model)
        t0 = time.perf_counter()
        table = compare_alone_and_together(weights, [lm.chat_ids(q) for q in QUESTIONS[:args.prompts]],
                                           args.tokens)
        seconds = time.perf_counter() - t0
        print(f"{dtype}: {seconds:.0f} s\n{table.to_string()}")
        runs[dtype] = {"seconds": round(seconds, 1), "rows": json.loads(table.to_json(orient="records"))}
    name = device_name(lm.device)
    out = Path(args.out) / f"{device_slug(name)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "device": name, "torch": torch.__version__, "model": lm.name, "measured": str(datetime.date.today()),
        "max_new_tokens": args.tokens, "questions": QUESTIONS[:args.prompts], "runs": runs}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
