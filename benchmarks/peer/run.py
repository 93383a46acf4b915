"""Running every contender, comparing them, printing the table, and the command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from batchlab.analysis import metrics
from batchlab.model.cpu_kernels import describe_kernels
from .config import BATCHLAB_CONTENDERS, BenchConfig, CONTENDERS, DTYPE_CHOICES, GREEDY_REFERENCE, HF_CONTENDERS, LABELS, MODES, REFERENCE, TINY, VLLM_CONTENDERS, bench_workload, warmup_workload
from .engines import machine_limits, run_batchlab
from .hf import ContenderRun, run_hf_continuous_once, run_hf_generate
from .memory import PeakMemory
from .vllm_contender import run_vllm_offline, run_vllm_online, vllm_ready
from batchlab.requests import Request, RequestStatus
from batchlab.trace import Trace


# =============================================================================================
# Running everything
# =============================================================================================

def contender_summary(run: ContenderRun) -> dict:
    """The numbers the table shows, from the run's trace and wall time (seconds, tokens/s)."""
    per_request = metrics.per_request_metrics(run.trace)
    output_tokens = int(per_request["num_output_tokens"].sum())
    ttft, e2e = per_request["ttft"].to_numpy(), per_request["e2e"].to_numpy()
    unfinished = {r.request_id: r.finish_reason or RequestStatus(r.status).value
                  for r in run.trace.requests if RequestStatus(r.status) != RequestStatus.FINISHED}
    return {
        "label": LABELS[run.name], "streamed": run.streamed,
        "num_requests": len(run.trace.requests), "num_finished": int(len(per_request)),
        "unfinished": unfinished, "output_tokens": output_tokens,
        "wall_seconds": run.wall_seconds, "cpu_seconds": run.cpu_seconds,
        "throughput_tok_s": output_tokens / run.wall_seconds,
        "tokens_per_cpu_second": output_tokens / run.cpu_seconds if run.cpu_seconds > 0 else None,
        "ttft_p50_s": float(np.percentile(ttft, 50)), "ttft_p99_s": float(np.percentile(ttft, 99)),
        "e2e_p50_s": float(np.percentile(e2e, 50)), "e2e_p99_s": float(np.percentile(e2e, 99)),
        "peak_memory_mib": None if run.peak_memory_bytes is None else run.peak_memory_bytes / 2**20,
        "memory_method": run.memory_method,
    }


def greedy_agreement(outputs: dict[str, dict[str, list[int]]], reference: str) -> dict:
    """For each run: how many requests' tokens equal ``reference``'s exactly, and for the others
    the first position where they differ (or the shorter length, if one is a prefix)."""
    ref = outputs[reference]
    report = {}
    for name, tokens_by_id in outputs.items():
        mismatches = {}
        for rid, ref_tokens in ref.items():
            mine = tokens_by_id.get(rid)
            if mine is None:
                mismatches[rid] = None
                continue
            if mine != ref_tokens:
                first = next((i for i, (a, b) in enumerate(zip(mine, ref_tokens)) if a != b),
                             min(len(mine), len(ref_tokens)))
                mismatches[rid] = first
        report[name] = {"matches": len(ref) - len(mismatches), "total": len(ref),
                        "mismatches_first_position": mismatches}
    return report


def machine_info() -> dict:
    """Where the numbers come from: the package's environment report, transformers, load."""
    import transformers

    from batchlab.model.cpu_kernels import kernel_report
    from batchlab.model.environment import environment_report

    return {**environment_report(), "transformers": transformers.__version__, "kernels": kernel_report(),
            "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def _page_in_weights(lm, request: Request) -> None:
    """One forward pass before any contender: the weights are memory-mapped from the cached
    checkpoint, and the first pass reads them in (about 500 MiB of RSS). Without it the first
    contender would be charged for the shared weights."""
    import torch

    with torch.inference_mode():
        lm.model(torch.tensor([request.prompt_ids]))


def _measured(fn: Callable[[], ContenderRun]) -> ContenderRun:
    with PeakMemory() as mem:
        run = fn()
    run.peak_memory_bytes, run.memory_method = mem.peak_bytes, mem.method
    return run


def run_benchmark(config: BenchConfig, lm=None, log: Callable[[str], None] = print) -> dict:
    """Run every chosen contender on the workload in each of ``config.dtypes``; returns the
    JSON-ready results: ``{"dtypes": [...], "runs": {dtype: that dtype's results}}``.

    ``lm``: a loaded model to use for its own dtype (the others are loaded here, one at a time).
    """
    import torch

    from batchlab.model import load_model, set_cpu_threads

    threads_before = torch.get_num_threads()
    if config.threads is not None:
        set_cpu_threads(config.threads)
    runs = {}
    try:
        for dtype in config.dtypes:
            log(f"== dtype {dtype}")
            model = lm if lm is not None and lm.dtype == dtype else load_model(device="cpu", dtype=dtype)
            if config.threads is not None:
                set_cpu_threads(config.threads)   # load_model sets its own default
            runs[dtype] = _run_all(_effective(config), model, log)
            del model
    finally:
        torch.set_num_threads(threads_before)   # leave an in-process caller's setting as it was
    return {"dtypes": list(config.dtypes), "runs": runs}


def _run_all(config: BenchConfig, lm, log: Callable[[str], None]) -> dict:
    requests = bench_workload(config, lm.tokenizer)
    warm = warmup_workload(lm.tokenizer) if config.warmup else None
    _page_in_weights(lm, warmup_workload(lm.tokenizer)[0])
    log("measuring this machine's memory bandwidth and matmul speed ...")
    limits = machine_limits(lm, requests)
    hf_timeout = 60.0 + 5.0 * sum(r.max_new_tokens for r in requests)   # generous: a hang, not slowness
    results: dict = {"dtype": lm.dtype, "machine": machine_info(), "config": _config_dict(config),
                     "workload": _workload_dict(config, requests),
                     "model": {"name": lm.name, "device": lm.device, "dtype": lm.dtype},
                     "limits": limits, "contenders": {}, "errors": {}, "skipped": {}}
    outputs: dict[str, dict[str, list[int]]] = {}

    def keep(run: ContenderRun) -> None:
        summary = contender_summary(run)
        results["contenders"][run.name] = {**summary, "settings": run.settings, "extra": run.extra,
                                           "requests": _requests_dict(run.trace)}
        if all(r.output_ids for r in run.trace.requests):   # vLLM's server streams text: not compared
            outputs[run.name] = {r.request_id: r.output_ids for r in run.trace.requests}
        log(f"  {run.name:<20} {summary['throughput_tok_s']:8.1f} tok/s  wall {run.wall_seconds:7.2f} s  "
            f"TTFT p50 {summary['ttft_p50_s']:6.2f} s")

    for name in CONTENDERS:
        if name not in config.only:
            continue
        log(f"running {name} ...")
        try:
            if name == "hf_continuous":
                tries = []
                for mbt in config.hf_batch_tokens:
                    run = _measured(lambda: run_hf_continuous_once(
                        lm, requests, mbt, config.hf_page_size, warm, hf_timeout, config.profile))
                    tries.append(run)
                    summary = contender_summary(run)
                    log(f"    max_batch_tokens={mbt:<5} {summary['throughput_tok_s']:8.1f} tok/s  "
                        f"TTFT p50 {summary['ttft_p50_s']:6.2f} s  ({run.extra['num_steps']} steps)")
                best = max(tries, key=lambda r: contender_summary(r)["throughput_tok_s"])
                best.extra["tries"] = [{**r.settings, **r.extra, **contender_summary(r)} for r in tries]
                keep(best)
            elif name in VLLM_CONTENDERS:
                ok, message = vllm_ready()
                if not ok:   # not an error: the other contenders' numbers stand on their own
                    results["skipped"][name] = message
                    log(f"  {message}")
                    continue
                runner = run_vllm_offline if config.mode == "offline" else run_vllm_online
                keep(runner(requests, config, lm.dtype, warm, compiled=name == "vllm_compiled"))
            elif name in HF_CONTENDERS:
                size, streamed = (1, True) if name == "hf_sequential" else (config.batch_size, False)
                keep(_measured(lambda: run_hf_generate(lm, requests, size, streamed, name, warm,
                                                       config.profile)))
            else:
                keep(_measured(lambda: run_batchlab(lm, requests, name, config, warm)))
        except Exception as err:   # one contender failing must not hide the others' numbers
            results["errors"][name] = f"{type(err).__name__}: {err}"
            log(f"  {name} FAILED: {results['errors'][name]}")

    _add_ratios(results)
    if config.mode == "offline":
        _bound_fractions(results)
    reference = GREEDY_REFERENCE if GREEDY_REFERENCE in outputs else next(iter(outputs), None)
    results["greedy_reference"] = reference
    results["greedy_agreement"] = greedy_agreement(outputs, reference) if reference else {}
    results["machine"]["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return results


def _effective(config: BenchConfig) -> BenchConfig:
    """``tiny`` replaces the sizes with ``TINY``'s."""
    if not config.tiny:
        return config
    return BenchConfig(**{**asdict(config), "num_requests": TINY["num_requests"],
                          "hf_batch_tokens": TINY["hf_batch_tokens"], "rate": max(config.rate, 20.0)})


def fastest_vllm(contenders: dict) -> str | None:
    """vLLM's best configuration in a run: the faster of its contenders that ran (None: none ran)."""
    ran = [name for name in VLLM_CONTENDERS if name in contenders]
    return max(ran, key=lambda name: contenders[name]["throughput_tok_s"]) if ran else None


def _add_ratios(results: dict) -> None:
    results["vllm_reference"] = fastest_vllm(results["contenders"])
    ref = results["contenders"].get(REFERENCE)
    vllm = results["contenders"].get(results["vllm_reference"])
    for summary in results["contenders"].values():
        summary["throughput_vs_vllm"] = None if vllm is None else \
            summary["throughput_tok_s"] / vllm["throughput_tok_s"]
        summary["ttft_p50_vs_vllm"] = None if vllm is None else summary["ttft_p50_s"] / vllm["ttft_p50_s"]
        if ref is None:
            summary["throughput_vs_hf_continuous"] = summary["ttft_p50_vs_hf_continuous"] = None
            summary["cpu_efficiency_vs_hf_continuous"] = None
            continue
        summary["throughput_vs_hf_continuous"] = summary["throughput_tok_s"] / ref["throughput_tok_s"]
        mine, theirs = summary["tokens_per_cpu_second"], ref["tokens_per_cpu_second"]
        summary["cpu_efficiency_vs_hf_continuous"] = mine / theirs if mine and theirs else None
        summary["ttft_p50_vs_hf_continuous"] = summary["ttft_p50_s"] / ref["ttft_p50_s"]


def _bound_fractions(results: dict) -> None:
    """Each contender's throughput as a fraction of the machine's bound (offline only)."""
    bound = results["limits"]["bound_tok_s"]
    for summary in results["contenders"].values():
        summary["fraction_of_bound"] = summary["throughput_tok_s"] / bound


def _config_dict(config: BenchConfig) -> dict:
    d = asdict(config)
    d["only"], d["hf_batch_tokens"] = list(config.only), list(config.hf_batch_tokens)
    return d


def _workload_dict(config: BenchConfig, requests: Sequence[Request]) -> dict:
    return {"preset": config.preset, "scale": "cpu", "seed": config.seed, "mode": config.mode,
            "arrival": "at_once" if config.mode == "offline" else "poisson",
            "rate": None if config.mode == "offline" else config.rate,
            "num_requests": len(requests),
            "prompt_tokens": sum(r.prompt_len for r in requests),
            "output_tokens": sum(r.max_new_tokens for r in requests),
            "requests": [{"request_id": r.request_id, "arrival_time": r.arrival_time,
                          "prompt_len": r.prompt_len, "max_new_tokens": r.max_new_tokens} for r in requests]}


def _requests_dict(trace: Trace) -> list[dict]:
    return [{"request_id": r.request_id, "token_times": r.token_times, "release_time": r.release_time,
             "output_ids": r.output_ids} for r in trace.requests]


# =============================================================================================
# Printing
# =============================================================================================

def format_header(results: dict, command: str) -> str:
    m, w = results["machine"], results["workload"]
    load = m.get("loadavg_start")
    lines = [f"benchmarks.peer  {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}",
             f"command:  {command}",
             f"machine:  {m['device_name']}, {m['cpu_cores_usable']} cores usable, torch threads "
             f"{m['torch_threads']}, {m['platform']}",
             f"kernels:  {describe_kernels(m['kernels'])}" if m.get("kernels") else "kernels:  not recorded",
             f"versions: python {m['python']}, torch {m['torch']}, transformers {m['transformers']}",
             f"model:    {results['model']['name']} on {results['model']['device']} "
             f"({results['model']['dtype']})",
             f"load:     os.getloadavg() = {tuple(round(x, 2) for x in load) if load else 'n/a'} "
             "(1, 5, 15 min) at start",
             f"workload: {w['num_requests']} requests, preset {w['preset']!r} (scale cpu), seed {w['seed']}, "
             f"{w['prompt_tokens']} prompt + {w['output_tokens']} output tokens, greedy, exact lengths, "
             + ("all at t=0 (offline)" if w["mode"] == "offline"
                else f"Poisson at {w['rate']} req/s (online)")]
    return "\n".join(lines)


def format_table(results: dict) -> str:
    """The contenders side by side; ratios are to transformers' continuous batching and to vLLM."""
    head = (f"{'contender (' + results['dtype'] + ')':<44} {'stream':>6} {'tok/s':>7} {'x HF-CB':>7} "
            f"{'x vLLM':>6} {'tok/CPU-s':>9} {'x HF-CB':>7} {'TTFT p50':>9} {'TTFT p99':>9} "
            f"{'E2E p50':>8} {'E2E p99':>8} {'TTFT50 /HF':>10} {'peak MiB':>9} {'greedy =':>9}")
    lines = [head, "-" * len(head)]
    agreement = results.get("greedy_agreement", {})
    for name in CONTENDERS:
        s = results["contenders"].get(name)
        if s is None:
            if name in results.get("errors", {}):
                lines.append(f"{LABELS[name]:<44} FAILED: {results['errors'][name].splitlines()[0]}")
            elif name in results.get("skipped", {}):
                lines.append(f"{LABELS[name]:<44} skipped: {results['skipped'][name]}")
            continue
        label = s["label"]
        if name == "hf_continuous":
            label += f" (mbt={s['settings']['max_batch_tokens']})"
        elif name in ("hf_static", "batchlab_static", "batchlab_dynamic"):
            label += f" of {results['config']['batch_size']}"
        elif name in VLLM_CONTENDERS:
            label += " (LLM.generate)" if results["config"]["mode"] == "offline" else " (its server)"
        ratio = "" if s["throughput_vs_hf_continuous"] is None else f"{s['throughput_vs_hf_continuous']:.2f}x"
        vllm_ratio = "" if s["throughput_vs_vllm"] is None else f"{s['throughput_vs_vllm']:.2f}x"
        cpu_ratio = "" if s["cpu_efficiency_vs_hf_continuous"] is None \
            else f"{s['cpu_efficiency_vs_hf_continuous']:.2f}x"
        per_cpu = "n/a" if s["tokens_per_cpu_second"] is None else f"{s['tokens_per_cpu_second']:.1f}"
        ttft_ratio = "" if s["ttft_p50_vs_hf_continuous"] is None else f"{s['ttft_p50_vs_hf_continuous']:.2f}"
        mem = "n/a" if s["peak_memory_mib"] is None else f"{s['peak_memory_mib']:.0f}"
        agree = agreement.get(name)
        greedy = "" if agree is None else f"{agree['matches']}/{agree['total']}"
        lines.append(f"{label:<44} {'yes' if s['streamed'] else 'no':>6} {s['throughput_tok_s']:7.1f} "
                     f"{ratio:>7} {vllm_ratio:>6} {per_cpu:>9} {cpu_ratio:>7} {s['ttft_p50_s']:8.2f}s "
                     f"{s['ttft_p99_s']:8.2f}s {s['e2e_p50_s']:7.2f}s {s['e2e_p99_s']:7.2f}s "
                     f"{ttft_ratio:>10} {mem:>9} {greedy:>9}")
    return "\n".join(lines)


def format_details(results: dict) -> str:
    """Greedy mismatches, the manager's tries, and where the time went."""
    lines = []
    for name, s in results["contenders"].items():
        if s["unfinished"]:
            lines.append(f"{name}: {len(s['unfinished'])} of {s['num_requests']} requests did not finish: "
                         + "; ".join(f"{rid}: {why}" for rid, why in s["unfinished"].items()))
    ref = results.get("greedy_reference")
    for name, agree in results.get("greedy_agreement", {}).items():
        if agree["mismatches_first_position"]:
            firsts = ", ".join(f"{rid}@{pos}" for rid, pos in agree["mismatches_first_position"].items())
            lines.append(f"greedy: {name} differs from {ref} in {len(agree['mismatches_first_position'])} "
                         f"requests (request@first differing token): {firsts}")
    if ref and not any(a["mismatches_first_position"] for a in results["greedy_agreement"].values()):
        lines.append(f"greedy: every compared contender's tokens equal {ref}'s for every request")
    uncompared = [n for n in results["contenders"] if n not in results.get("greedy_agreement", {})]
    if uncompared:
        lines.append(f"greedy: not compared (the server streams text, not token ids): {', '.join(uncompared)}")
    cb = results["contenders"].get("hf_continuous")
    if cb:
        tries = ", ".join(f"mbt={t['max_batch_tokens']}: {t['throughput_tok_s']:.1f} tok/s"
                          for t in cb["extra"].get("tries", []))
        e = cb["extra"]
        lines.append(f"transformers CB tries: {tries}; {cb['settings']['num_blocks']} KV pages of "
                     f"{cb['settings']['page_size']} tokens")
        ms_per_step = 1e3 * e["busy_seconds"] / max(e["num_steps"], 1)
        lines.append(f"hf_continuous: {e['num_steps']} steps, {ms_per_step:.1f} "
                     f"ms/step; model steps {e['busy_seconds']:.2f} s of {cb['wall_seconds']:.2f} s wall")
    for name in (n for n in VLLM_CONTENDERS if n in results["contenders"]):
        v = results["contenders"][name]
        e = v["extra"]
        rss = e.get("peak_rss_mib_with_weights")
        lines.append(f"{name}: {v['settings']['engine']}, {v['settings']['dtype']}; start-up "
                     + (f"{e['load_seconds']:.0f} s (not timed); " if "load_seconds" in e else "(not timed); ")
                     + f"TTFT from {e['ttft_source']}"
                     + ("" if rss is None else f"; its processes' peak RSS {rss:.0f} MiB with its own weights"))
    if results.get("vllm_reference"):
        lines.append(f"x vLLM: against {LABELS[results['vllm_reference']]}, vLLM's faster configuration "
                     "in this run")
    for name in BATCHLAB_CONTENDERS:
        s = results["contenders"].get(name)
        if s:
            e = s["extra"]
            ms_per_step = 1e3 * e["busy_seconds"] / max(e["num_steps"], 1)
            lines.append(f"{name}: {e['num_steps']} steps, {ms_per_step:.1f} ms/step; model "
                         f"{e['busy_seconds']:.2f} s (prefill steps {e['prefill_step_seconds']:.2f} s, "
                         f"decode-only {e['decode_only_step_seconds']:.2f} s) of "
                         f"{s['wall_seconds']:.2f} s wall; "
                         f"{e['mean_seqs_per_step']:.1f} seqs/step")
    for name in CONTENDERS:
        s = results["contenders"].get(name)
        if s and "op_seconds" in s["extra"]:
            ops = s["extra"]["op_seconds"]
            total = sum(ops.values())
            shares = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in ops.items())
            outside = s["extra"].get("outside_ops_seconds")
            outside = ("" if outside is None
                       else f"; outside torch ops {outside:.1f} s of {s['wall_seconds']:.1f} s wall")
            lines.append(f"profile {name}: torch op time {total:.1f} s = {shares}{outside}")
    limits = results.get("limits")
    if limits and results["workload"]["mode"] == "offline":
        ref = results["contenders"].get(REFERENCE)
        room = "" if ref is None else (
            f"; transformers CB reaches {100 * ref['fraction_of_bound']:.0f}% of it, "
            f"so no engine could be more than {1 / ref['fraction_of_bound']:.1f}x faster")
        lines.append(f"limits here and now (torch threads {results['machine']['torch_threads']}): weights "
                     f"{limits['weight_bytes'] / 1e6:.0f} MB at "
                     f"{limits['bandwidth_bytes_s'] / 1e9:.1f} GB/s = "
                     f"{1e3 * limits['step_floor_s']:.0f} ms/step x {limits['min_steps']} steps = "
                     f"{limits['memory_bound_s']:.1f} s; {limits['flops'] / 1e9:.0f} GFLOP at "
                     f"{max(limits['matmul_flops_s'], limits.get('fp32_matmul_flops_s', 0)) / 1e9:.0f} GFLOP/s = "
                     f"{limits['compute_bound_s']:.1f} s; "
                     f"so at most {limits['bound_tok_s']:.0f} tok/s for any {results['dtype']} engine{room}")
        if "bound_tok_s_dtype_matmul" in limits:
            lines.append(f"  (compute at the faster of torch's {results['dtype']} matmul peak, "
                         f"{limits['matmul_flops_s'] / 1e9:.1f} GFLOP/s measured at {limits['matmul_size']}^3, "
                         f"and its fp32 peak, {limits['fp32_matmul_flops_s'] / 1e9:.0f} GFLOP/s: an engine may "
                         f"widen {results['dtype']} weights to fp32 per product; at torch's "
                         f"{results['dtype']} peak alone the bound would be "
                         f"{limits['bound_tok_s_dtype_matmul']:.1f} tok/s)")
    load = results["machine"].get("loadavg_end")
    if load:
        lines.append(f"load at end: os.getloadavg() = {tuple(round(x, 2) for x in load)}")
    return "\n".join(lines)


def format_dtype_summary(results: dict) -> str:
    """Throughput (tok/s) and TTFT p50 of every contender in each dtype, with each dtype's ceiling."""
    dtypes = list(results["runs"])
    head = f"{'contender':<36}" + "".join(f" {d + ' tok/s':>15} {'TTFT p50':>9}" for d in dtypes)
    lines = [head, "-" * len(head)]
    for name in CONTENDERS:
        cells, seen = [], False
        for d in dtypes:
            s = results["runs"][d]["contenders"].get(name)
            seen |= s is not None
            cells.append(f" {'-':>15} {'-':>9}" if s is None
                         else f" {s['throughput_tok_s']:15.1f} {s['ttft_p50_s']:8.2f}s")
        if seen:
            lines.append(f"{LABELS[name]:<36}" + "".join(cells))
    limits = [results["runs"][d].get("limits") for d in dtypes]
    if all(limits) and results["runs"][dtypes[0]]["workload"]["mode"] == "offline":
        lines.append(f"{'ceiling (any engine, these weights)':<36}"
                     + "".join(f" {lim['bound_tok_s']:15.0f} {'':>9}" for lim in limits))
    return "\n".join(lines)


# =============================================================================================
# Command line
# =============================================================================================

def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def parse_args(argv: Sequence[str] | None = None) -> tuple[BenchConfig, str]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peer", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=MODES, default="offline",
                   help="offline: all requests at t=0; online: Poisson arrivals on the wall clock")
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--rate", type=float, default=2.0, help="requests/s for --mode online")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default=",".join(CONTENDERS),
                   help=f"comma-separated contenders (default all): {','.join(CONTENDERS)}")
    p.add_argument("--batch-size", type=int, default=8, help="static/dynamic batch size")
    p.add_argument("--dynamic-timeout", type=float, default=0.1, help="dynamic batcher timeout, s")
    p.add_argument("--max-num-seqs", type=int, default=32, help="batchlab continuous: sequences at once")
    p.add_argument("--max-num-batched-tokens", type=int, default=512, help="batchlab continuous: tokens per step")
    p.add_argument("--hf-batch-tokens", type=_int_list, default=(64, 128, 256, 512),
                   help="max_batch_tokens values tried for transformers' continuous batching")
    p.add_argument("--hf-page-size", type=int, default=64,
                   help="tokens per KV page for transformers' manager")
    p.add_argument("--tiny", action="store_true", help="4 requests of a few tokens (the test's size)")
    p.add_argument("--no-warmup", action="store_true", help="skip the two warm-up requests per contender")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: every core this process may use)")
    p.add_argument("--profile", action="store_true",
                   help="profile each timed run's torch ops and print where the time goes (adds overhead)")
    p.add_argument("--dtype", default="float32",
                   help=f"weights' dtype for every contender: {', '.join(DTYPE_CHOICES)} (each in turn)")
    p.add_argument("--out", default="bench_results.json", help="where to write the JSON results")
    args = p.parse_args(argv)
    try:
        config = _config_from_args(args)
    except ValueError as e:   # a bad value: argparse's usage line and the config's own message, exit 2
        p.error(str(e))
    return config, args.out


def _config_from_args(args: argparse.Namespace) -> BenchConfig:
    return BenchConfig(mode=args.mode, num_requests=args.num_requests, rate=args.rate, seed=args.seed,
                       only=tuple(x.strip() for x in args.only.split(",") if x.strip()),
                       batch_size=args.batch_size, dynamic_timeout=args.dynamic_timeout,
                       max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                       hf_batch_tokens=args.hf_batch_tokens, hf_page_size=args.hf_page_size,
                       tiny=args.tiny, warmup=not args.no_warmup, threads=args.threads,
                       profile=args.profile, dtype=args.dtype)


def main(argv: Sequence[str] | None = None, lm=None) -> dict:
    """Run the benchmark from command-line arguments; print the table; write the JSON."""
    argv = list(sys.argv[1:] if argv is None else argv)
    config, out = parse_args(argv)
    command = " ".join(["python -m benchmarks.peer", *argv])
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"benchmarks.peer: {command}\nos.getloadavg() = {load}", flush=True)
    results = run_benchmark(config, lm=lm, log=lambda s: print(s, flush=True))
    results["command"] = command
    results["created_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    sections = []
    for run in results["runs"].values():
        sections += [format_header(run, command), format_table(run), format_details(run)]
    if len(results["runs"]) > 1:
        sections.append(format_dtype_summary(results))
    text = "\n\n".join(sections)
    print("\n" + text)
    results["table"] = text
    path = Path(out)
    if path.parent != Path(""):
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, default=_json_default) + "\n")
    print(f"\nJSON written to {path}")
    return results


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    return str(value)
