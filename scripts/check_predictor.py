"""Check batchlab.predict against measured vLLM serving runs, stage by stage, and print the errors.

    .venv/bin/python scripts/check_predictor.py RUNS.jsonl [--gpu H100] [--max-requests N] [--peers]

RUNS.jsonl holds one JSON object per measured load stage (the project ships none: use public runs
whose licence you have checked). Each object has ``model`` (a Hugging Face name such as
``meta-llama/Llama-2-7b-hf``, or a name of ``batchlab.shapes``), ``tensor_parallel``, ``gpu``
(optional), ``flags`` (vLLM's flags by their names: ``max_num_seqs``, ``max_num_batched_tokens``,
``max_model_len``, ``block_size``, ...), ``workload`` (``rate_rps``, ``arrival`` starting with
"constant" or "poisson", ``num_requests``, ``input_tokens`` and ``output_tokens`` as ``{"p50": ...}``,
``prefix_tokens`` and ``resolved_shared_prefix.num_groups`` when prompts share a system prompt;
``prompt_pool`` when the client cycled through that many fixed prompts, each sent again verbatim
after ``prompt_pool`` requests, so that vLLM's prefix cache holds all of a repeated prompt but its
last partial block) and ``measured`` (``ttft_ms`` and ``e2e_ms`` as ``{"p50": ...}``). TPOT's
median is taken as ``(e2e p50 - ttft p50) / (output p50 - 1)``, so that clients that count stream
events instead of tokens compare alike. A stage whose measured median TTFT is over 10 s counts as saturated.

``--inference-sim DIR`` reads the layout of inference-sim's ``training`` repository instead (a
local clone: ``default_args/<run>/exp-config.yaml`` for the model, TP and flags,
``results/config.yaml`` for the shared-prefix workload and its stages, and each stage's
``results/stage_N_lifecycle_metrics.json`` for the measured medians); a model named there is read
from its ``model_configs/<name>/config.json`` when the shapes table does not hold it. Its client,
inference-perf, generates ``num_groups x num_prompts_per_group`` prompts once and sends them in
turn (``data_index % len(prompts)`` in its shared-prefix generator), so those stages are predicted
with that ``prompt_pool``: after the first round every prompt is one the server has cached.

The last line is the median absolute error over TTFT, TPOT and E2E p50 of every stage that both
the real server and the prediction keep up with, and how many saturation verdicts were right;
when a stage the real server kept up with is predicted saturated, a line before it gives the
median with those stages counted too.

``--peers`` also prints, under each stage, NVIDIA AIConfigurator's estimate of it (its CLI, run from
``.venv-aiconfigurator/``: ``bash scripts/setup_aiconfigurator.sh`` installs it) and, last, its own
median error over the same stages. AIConfigurator models a fixed number of requests in flight, not
an arrival rate, so its batch size is the stage's concurrency by Little's law: rate x its own E2E,
iterated from batch 1 until the batch stops changing (6 rounds at most), capped at max_num_seqs.
It reads the model from the folder of the stage's ``config_path`` (for ``--inference-sim``, its
``model_configs/<name>/``); a stage without one is skipped, as batchlab.shapes holds no raw configs.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batchlab.predict import Deployment, EngineArgs, TrafficSpec, predict  # noqa: E402
from batchlab.shapes import MODEL_SHAPES  # noqa: E402

HF_NAMES = {"meta-llama/Llama-2-7b-hf": "Llama-2-7B", "meta-llama/Llama-2-70b-hf": "Llama-2-70B",
            "codellama/CodeLlama-34b-Instruct-hf": "CodeLlama-34B", "codellama/CodeLlama-34b-hf": "CodeLlama-34B",
            "meta-llama/Meta-Llama-3-8B": "Llama-3-8B", "meta-llama/Meta-Llama-3-8B-Instruct": "Llama-3-8B"}
FLAG_NAMES = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size")
SATURATED_TTFT_MS = 10_000
KEYS = ("ttft", "tpot", "e2e")
AIC = ROOT / ".venv-aiconfigurator" / "bin" / "aiconfigurator"
AIC_SYSTEMS = {"L4": "l4", "A100": "a100_sxm", "H100": "h100_sxm", "H200": "h200_sxm"}  # batchlab's GPU -> AIC's
AIC_ROW = re.compile(r"^\s*(TTFT|TPOT):\s+([0-9.]+) ms", re.MULTILINE)   # rows of its summary box
PEER_ROUNDS = 6


def inference_sim_runs(root: Path) -> list[dict]:
    """The stages of inference-sim's ``training`` layout, as this script's run objects."""
    import yaml

    runs = []
    for exp in sorted((root / "default_args").iterdir()):
        server = yaml.safe_load((exp / "exp-config.yaml").read_text(encoding="utf-8"))
        config = yaml.safe_load((exp / "results" / "config.yaml").read_text(encoding="utf-8"))
        shared = config["data"]["shared_prefix"]
        multi_turn = bool(shared.get("enable_multi_turn_chat"))     # then each turn adds to the prompt
        pool = None if multi_turn else int(shared["num_groups"]) * int(shared.get("num_prompts_per_group", 1))
        local = root / "model_configs" / server["model"].split("/")[-1] / "config.json"
        for i, stage in enumerate(config["load"]["stages"]):
            path = exp / "results" / f"stage_{i}_lifecycle_metrics.json"
            if not path.is_file():
                continue
            m = json.loads(path.read_text(encoding="utf-8"))["successes"]
            runs.append({"model": server["model"], "config_path": str(local) if local.is_file() else None,
                         "tensor_parallel": server["tensor_parallelism"],
                         "flags": {k: server[k] for k in FLAG_NAMES if k in server},
                         "workload": {"rate_rps": stage["rate"], "arrival": config["load"]["type"],
                                      "num_requests": int(stage["rate"] * stage["duration"]),
                                      "input_tokens": {"p50": m["prompt_len"]["median"]},
                                      "output_tokens": {"p50": m["output_len"]["median"]},
                                      "prefix_tokens": shared["system_prompt_len"],
                                      "resolved_shared_prefix": {"num_groups": shared["num_groups"]},
                                      "prompt_pool": pool},
                         "measured": {"ttft_ms": {"p50": 1e3 * m["latency"]["time_to_first_token"]["median"]},
                                      "e2e_ms": {"p50": 1e3 * m["latency"]["request_latency"]["median"]}},
                         "source": exp.name})
    return runs


def stage_prediction(run: dict, gpu: str, max_requests: int | None) -> dict:
    """Predicted and measured p50s of one stage (raises ValueError if it cannot be expressed)."""
    model = HF_NAMES.get(run["model"], run["model"])
    if model not in MODEL_SHAPES:
        if not run.get("config_path"):
            raise ValueError(f"model={run['model']!r}; not in the shapes table")
        model = run["config_path"]
    flags = EngineArgs(**{k: int(run["flags"][k]) for k in FLAG_NAMES if k in run["flags"]})
    w = run["workload"]
    n = int(w["num_requests"]) if max_requests is None else min(int(w["num_requests"]), max_requests)
    prompt = int(w["input_tokens"]["p50"])
    prefix = int(w.get("prefix_tokens") or 0)
    groups = int((w.get("resolved_shared_prefix") or {}).get("num_groups") or 1)
    if w.get("prompt_pool"):        # the same prompts in turn: request i repeats request i - pool, all but
        prefix, groups = prompt - 1, int(w["prompt_pool"])     # its last token (vLLM computes at least one)
    spec = TrafficSpec(num_prompts=n, request_rate=float(w["rate_rps"]),
                       arrival="constant" if str(w.get("arrival", "")).startswith("constant") else "poisson",
                       input_len=max(1, prompt - prefix),
                       output_len=int(w["output_tokens"]["p50"]), prefix_len=prefix, num_prefix_groups=groups)
    deployment = Deployment(model, run.get("gpu_preset", gpu), int(run["tensor_parallel"]), args=flags)
    p = predict(deployment, spec.generate()).bench_result()
    m, out = run["measured"], int(w["output_tokens"]["p50"])
    measured = {"ttft": m["ttft_ms"]["p50"], "e2e": m["e2e_ms"]["p50"]}
    measured["tpot"] = (measured["e2e"] - measured["ttft"]) / max(out - 1, 1)
    predicted = {"ttft": p["median_ttft_ms"], "tpot": p["median_tpot_ms"], "e2e": p["median_e2el_ms"]}
    return {"measured": measured, "predicted": predicted,
            "saturated": (measured["ttft"] > SATURATED_TTFT_MS, p["median_ttft_ms"] > SATURATED_TTFT_MS)}


def aiconfigurator(model_dir: Path, system: str, tp: int, isl: int, osl: int, batch: int,
                   cache: dict[tuple, dict[str, float]]) -> dict[str, float]:
    """AIConfigurator's TTFT and TPOT in ms at one batch size, once per run (ValueError with its error)."""
    key = (str(model_dir), system, tp, isl, osl, batch)
    if key in cache:
        return cache[key]
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    cmd = [str(AIC), "cli", "estimate", "--backend", "vllm", "--system", system, "--model-path", str(model_dir),
           "--isl", str(isl), "--osl", str(osl), "--batch-size", str(batch), "--tp-size", str(tp),
           "--log-level", "ERROR"]
    if any(config.get(k) for k in ("num_local_experts", "num_experts", "n_routed_experts")):
        cmd += ["--moe-tp-size", str(tp), "--moe-ep-size", "1"]   # vLLM's default: experts split over TP ranks
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as err:
        raise ValueError(f"aiconfigurator ran over {err.timeout:.0f} s") from err
    found = dict(AIC_ROW.findall(done.stdout))
    if done.returncode or len(found) < 2:
        lines = (done.stdout + done.stderr).strip().splitlines() or ["no output"]
        raise ValueError(f"aiconfigurator exit {done.returncode}: "
                         + next((line for line in lines if line.startswith("Error")), lines[-1]).strip())
    cache[key] = {k.lower(): float(v) for k, v in found.items()}
    return cache[key]


def peer_prediction(run: dict, gpu: str, cache: dict[tuple, dict[str, float]]) -> dict[str, float]:
    """AIConfigurator's ttft, tpot and e2e p50 of one stage, and the batch they are at (ValueError if none)."""
    system = AIC_SYSTEMS.get(run.get("gpu_preset", gpu))
    if system is None:
        raise ValueError(f"gpu={run.get('gpu_preset', gpu)!r}; AIConfigurator is run for {', '.join(AIC_SYSTEMS)}")
    if not run.get("config_path") or not Path(run["config_path"]).is_file():
        raise ValueError(f"config_path={run.get('config_path')!r}; AIConfigurator needs the model's config.json")
    w = run["workload"]
    isl, osl, rate = int(w["input_tokens"]["p50"]), int(w["output_tokens"]["p50"]), float(w["rate_rps"])
    cap = int(run["flags"].get("max_num_seqs") or 10**6)   # vLLM never holds more requests in flight
    batch, p = 1, {}
    for _ in range(PEER_ROUNDS):   # Little's law: in flight = arrival rate x time in the system
        p = dict(aiconfigurator(Path(run["config_path"]).parent, system, int(run["tensor_parallel"]), isl, osl,
                                batch, cache), batch=batch)
        p["e2e"] = p["ttft"] + (osl - 1) * p["tpot"]
        batch = min(cap, max(1, round(rate * p["e2e"] / 1e3)))
        if batch == p["batch"]:
            break
    return p


def error_cells(measured: dict[str, float], predicted: dict[str, float]) -> tuple[str, list[float]]:
    """The printed comparison of one prediction with the measured p50s, and its relative errors."""
    errors = [predicted[k] / measured[k] - 1 for k in KEYS]
    cells = [f"{k} {measured[k]:9.1f} -> {predicted[k]:9.1f} ms ({e:+.0%})" for k, e in zip(KEYS, errors)]
    return "; ".join(cells), errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="?", help="JSON Lines of measured stages (see the module docstring)")
    parser.add_argument("--inference-sim", help="a local clone of inference-sim's training repository")
    parser.add_argument("--gpu", default="H100", help="the preset of runs that do not name one (H100)")
    parser.add_argument("--max-requests", type=int, help="predict at most this many requests per stage")
    parser.add_argument("--peers", action="store_true", help="also print NVIDIA AIConfigurator's estimates")
    args = parser.parse_args(argv)
    if args.peers and not AIC.is_file():
        print(f"check_predictor.py: --peers runs {AIC.relative_to(ROOT)}, which is missing; "
              "run `bash scripts/setup_aiconfigurator.sh` first", file=sys.stderr)
        return 2
    if args.inference_sim:
        root = Path(args.inference_sim)
        if not (root / "default_args").is_dir():
            print(f"check_predictor.py: --inference-sim={args.inference_sim!r}; must be a clone of inference-sim's "
                  "training repository (a folder holding default_args/)", file=sys.stderr)
            return 2
        path, lines = root, [json.dumps(run) for run in inference_sim_runs(root)]
    else:
        path = Path(args.runs or "")
        if not path.is_file():
            print(f"check_predictor.py: runs={args.runs!r}; must be an existing JSON Lines file", file=sys.stderr)
            return 2
        lines = path.read_text(encoding="utf-8").splitlines()
    errors, served, verdicts, peer_errors, peer_cache = [], [], [], [], {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            run = json.loads(line)
            if run.get("stage") == "summary":
                continue
            label = f"{run['model'].split('/')[-1]} tp{run['tensor_parallel']} {run['workload']['rate_rps']} req/s"
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
            print(f"check_predictor.py: {path.name} line {number}: {type(err).__name__} {err}; each line must be "
                  "a JSON object with model, tensor_parallel, flags, workload and measured", file=sys.stderr)
            return 2
        try:
            r = stage_prediction(run, args.gpu, args.max_requests)
        except (ValueError, KeyError, TypeError) as err:
            print(f"{label}: not expressible ({type(err).__name__ if isinstance(err, KeyError) else ''}{err})")
            continue
        cells, e = error_cells(r["measured"], r["predicted"])
        keeps_up = not any(r["saturated"])   # the stages both medians are taken over
        errors += [abs(x) for x in e] if keeps_up else []
        served += [abs(x) for x in e] if not r["saturated"][0] else []   # every stage the real server kept up with
        verdicts.append(r["saturated"][0] == r["saturated"][1])
        print(f"{label:>36}: {cells}; saturated {r['saturated'][0]} / predicted {r['saturated'][1]}")
        if args.peers:
            try:
                p = peer_prediction(run, args.gpu, peer_cache)
            except (ValueError, KeyError, TypeError, OSError) as err:
                kind = type(err).__name__ if isinstance(err, KeyError) else ""
                print(f"{'AIConfigurator':>36}: skipped ({kind}{err})")
                continue
            cells, e = error_cells(r["measured"], p)
            peer_errors += [abs(x) for x in e] if keeps_up else []
            print(f"{'AIConfigurator, batch ' + str(p['batch']):>36}: {cells}")
    if not verdicts:
        print("no stage could be predicted")
        return 1
    if len(served) > len(errors):
        print(f"median |error| over every stage the real server kept up with, those predicted saturated "
              f"included: {np.median(served):.1%} ({len(served) // 3} stages)")
    median = f"{np.median(errors):.1%}" if errors else "none"
    print(f"median |error| over TTFT, TPOT, E2E p50 of the stages that keep up: {median} "
          f"({len(errors) // 3} stages); saturation verdicts right: {sum(verdicts)} of {len(verdicts)}")
    if args.peers:
        median = f"{np.median(peer_errors):.1%}" if peer_errors else "none"
        print(f"AIConfigurator median |error| over TTFT, TPOT, E2E p50 of the stages that keep up: {median} "
              f"({len(peer_errors) // 3} stages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
