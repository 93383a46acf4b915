"""Make the capstone's traces in data/capstone/ (notebook 11): served by unnamed configurations.

    python scripts/make_capstone_traces.py               # rewrite the traces from cost_model.json
    python scripts/make_capstone_traces.py --calibrate   # first measure a new cost model on the
                                                         # real model (this machine), then rewrite
    python scripts/make_capstone_traces.py --out DIR     # write elsewhere (e.g. to compare)

Every trace is the batchlab engine serving a workload on the simulator (``SimBackend``) with the
cost model stored in ``data/capstone/cost_model.json``, which was calibrated on the real model
(``calibration.calibrate_cost_model``). Given that file the script is deterministic: workloads,
arrivals and the simulator's step noise are all seeded, so rerunning it rewrites byte-identical
traces (tests/test_capstone.py checks this).

Arrival rates are not written as requests per second but as multiples of what a healthy server
completes on the same device (``reference_rate``), so a cost model measured on another machine
(a GPU, say) gives traces with the same character.

Each configuration below is a deliberately unhealthy server. The saved files carry no label of
it (their ``meta`` holds only the file's name and how it was made): the reader of notebook 11
must diagnose each one from its measurements. The answers are in the checker
(``batchlab/exercises/nb11.py``); ``KNOBS`` and ``with_knob`` let tests confirm them by
turning each knob and re-serving the same workload.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from batchlab.analysis.trace_io import save_trace
from batchlab.sim import SimBackend
from batchlab.steptime.cost_model import CostModel
from batchlab.engine import Engine
from batchlab.requests import Request
from batchlab.schedulers import ContinuousBatcher, DynamicBatcher
from batchlab.schedulers.base import Scheduler
from batchlab.trace import Trace
from batchlab.workloads import Mixture, Range, make_arrivals, make_workload

CAPSTONE_DIR = Path(__file__).resolve().parent.parent / "data" / "capstone"
COST_MODEL_FILE = "cost_model.json"
SIM_NOISE = 0.05                 # lognormal step-time noise (about ±5 %), seeded per trace
KV_CAPACITY_TOKENS = 64 * 1024   # the simulated cache by default: large enough never to bind

# The knobs a reader may turn, and what each means in with_knob().
KNOBS: dict[str, str] = {
    "more_max_num_seqs": "let more sequences run at once (max_num_seqs x 8)",
    "chunked_prefill": "split long prompts: chunked prefill with 128 tokens per step",
    "more_capacity": "more capacity or less load (here: a device twice as fast)",
    "shorter_timeout": "a dynamic batcher's timer ten times shorter",
}


@dataclass(frozen=True)
class Segment:
    """A stretch of Poisson arrivals: ``num_requests`` requests at ``load`` x ``reference_rate``."""

    num_requests: int
    load: float


@dataclass(frozen=True)
class CapstoneConfig:
    """One server configuration and the traffic it serves.

    ``policy``: ``"continuous"`` (``max_num_seqs``, ``max_num_batched_tokens``, ``chunked_prefill``)
    or ``"dynamic"`` (``max_num_seqs`` is the batch size, ``timeout`` its timer, streaming).
    ``prompt_len`` / ``output_len``: length distributions (``workloads``). ``segments``: the
    arrival pattern, as loads relative to ``reference_rate``. ``speedup``: the
    device's speed relative to the calibrated one (the ``more_capacity`` knob doubles it).
    ``kv_capacity_tokens``: the simulated KV cache; when it is small, it (not ``max_num_seqs``)
    caps how many sequences run at once, as GPU memory does on a real server.
    """

    name: str
    policy: str
    prompt_len: object
    output_len: object
    segments: tuple[Segment, ...]
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    chunked_prefill: bool = True
    timeout: float = 0.0
    kv_capacity_tokens: int = KV_CAPACITY_TOKENS
    speedup: float = 1.0
    seed: int = 0
    about: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.policy not in ("continuous", "dynamic"):
            raise ValueError(f"{self.name}: policy={self.policy!r}; allowed: 'continuous', 'dynamic'")
        if not self.segments or any(s.num_requests < 1 or s.load <= 0 for s in self.segments):
            raise ValueError(f"{self.name}: segments need >= 1 request each and a load > 0")
        if self.speedup <= 0:
            raise ValueError(f"{self.name}: speedup={self.speedup!r}; must be > 0")

    @property
    def num_requests(self) -> int:
        return sum(s.num_requests for s in self.segments)


CHAT_PROMPTS = Mixture(((0.7, Range(8, 48)), (0.3, Range(48, 160))))
CHAT_OUTPUTS = Mixture(((0.6, Range(8, 32)), (0.4, Range(32, 96))))

CONFIGS: tuple[CapstoneConfig, ...] = (
    # The walked-through example: a chat service whose traffic peaks above what it can serve.
    CapstoneConfig("example", "continuous", CHAT_PROMPTS, CHAT_OUTPUTS,
                   segments=(Segment(90, 0.3), Segment(150, 1.5), Segment(60, 0.3)),
                   max_num_seqs=128, max_num_batched_tokens=1024, kv_capacity_tokens=1536, seed=10,
                   about="peak hour: more arrivals than the server can serve, for a while; "
                         "its memory holds about a dozen chat sequences"),
    # Long documents arrive among chatty streams; prompts are computed in one step each.
    CapstoneConfig("trace_a", "continuous",
                   Mixture(((0.4, Range(400, 800)), (0.6, Range(8, 48)))),
                   Mixture(((0.4, Range(4, 16)), (0.6, Range(64, 160)))),
                   segments=(Segment(240, 0.6),), max_num_seqs=32, max_num_batched_tokens=2048,
                   chunked_prefill=False, seed=11,
                   about="no chunked prefill: every long prompt stalls every stream"),
    # A server that admits only four sequences at a time.
    CapstoneConfig("trace_b", "continuous", CHAT_PROMPTS, CHAT_OUTPUTS,
                   segments=(Segment(240, 0.6),), max_num_seqs=4, max_num_batched_tokens=1024,
                   seed=12,
                   about="max_num_seqs=4: a queue forms while each step is nearly empty"),
    # A dynamic batcher with a long timer under light traffic, serving short answers.
    CapstoneConfig("trace_c", "dynamic", CHAT_PROMPTS, Range(8, 24),
                   segments=(Segment(240, 0.05),), max_num_seqs=32, timeout=2.0, seed=13,
                   about="dynamic batching, 2 s timer, light traffic: requests wait for the timer"),
    # Long answers, many streams at once: every step is big.
    CapstoneConfig("trace_d", "continuous", Range(8, 32), Range(200, 400),
                   segments=(Segment(200, 0.9),), max_num_seqs=256, max_num_batched_tokens=2048,
                   seed=14,
                   about="decode-bound: long answers, large batches, slow steps for everyone"),
)


# --- serving ---------------------------------------------------------------------------------
def scaled_cost(cost: CostModel, speedup: float) -> CostModel:
    """``cost`` on a device ``speedup`` times as fast (every coefficient divided by it)."""
    if speedup == 1.0:
        return cost
    return CostModel(*(c / speedup for c in cost.coefficients),
                     source=f"{cost.source}, x{speedup:g} faster")


def make_scheduler(config: CapstoneConfig) -> Scheduler:
    if config.policy == "continuous":
        return ContinuousBatcher(max_num_seqs=config.max_num_seqs,
                                 max_num_batched_tokens=config.max_num_batched_tokens,
                                 chunked_prefill=config.chunked_prefill)
    return DynamicBatcher(max_batch_size=config.max_num_seqs, timeout=config.timeout, stream=True)


def serve(config: CapstoneConfig, requests: list[Request], cost: CostModel) -> Trace:
    """Serve ``requests`` with ``config``'s scheduler on the simulator (seeded noise)."""
    backend = SimBackend(scaled_cost(cost, config.speedup), config.kv_capacity_tokens,
                         noise=SIM_NOISE, seed=config.seed)
    return Engine(make_scheduler(config), backend).run(requests)


REFERENCE_SERVER = dict(max_num_seqs=64, max_num_batched_tokens=512, chunked_prefill=True)


def reference_rate(config: CapstoneConfig, cost: CostModel) -> float:
    """Requests per second a healthy server (``REFERENCE_SERVER``, continuous batching on the
    calibrated device) completes on this workload while it is kept full.

    All requests arrive at once; while some still wait, every step is as full as the server
    allows. The rate is the requests finished by the last admission over that time. Loads are
    multiples of it, so the traffic is the same whatever knob the configuration turns.
    """
    requests = make_workload(config.num_requests, prompt_len=config.prompt_len,
                             output_len=config.output_len, arrival="at_once", seed=config.seed)
    backend = SimBackend(cost, KV_CAPACITY_TOKENS)
    trace = Engine(ContinuousBatcher(**REFERENCE_SERVER), backend).run(requests)
    last_admission = max(r.first_scheduled_time for r in trace.requests)
    finished = sum(1 for r in trace.requests if r.token_times[-1] <= last_admission)
    if last_admission <= 0 or finished == 0:
        raise ValueError(f"{config.name}: {config.num_requests} requests never fill the reference "
                         "server; use more requests")
    return finished / last_admission


def workload(config: CapstoneConfig, cost: CostModel) -> list[Request]:
    """The configuration's requests: its lengths, arrivals following its load segments."""
    rate = reference_rate(config, cost)
    requests = make_workload(config.num_requests, prompt_len=config.prompt_len,
                             output_len=config.output_len, arrival="at_once", seed=config.seed)
    rng = np.random.default_rng(config.seed + 1000)
    times, t0 = [], 0.0
    for seg in config.segments:
        gaps = np.diff(make_arrivals(seg.num_requests + 1, "poisson", rate * seg.load, seed=rng))
        times.extend(t0 + np.cumsum(gaps))
        t0 = times[-1]
    times = np.array(times) - times[0]  # the first request at t = 0
    for req, t in zip(requests, times):
        req.arrival_time = round(float(t), 6)
    return requests


def with_knob(config: CapstoneConfig, knob: str) -> CapstoneConfig:
    """The same configuration with one knob turned (see ``KNOBS``)."""
    if knob == "more_max_num_seqs":
        return dataclasses.replace(config, max_num_seqs=config.max_num_seqs * 8)
    if knob == "chunked_prefill":
        return dataclasses.replace(config, chunked_prefill=True,
                                   max_num_batched_tokens=min(config.max_num_batched_tokens, 128))
    if knob == "more_capacity":
        return dataclasses.replace(config, speedup=config.speedup * 2)
    if knob == "shorter_timeout":
        return dataclasses.replace(config, timeout=config.timeout / 10)
    raise ValueError(f"knob={knob!r}; allowed: {sorted(KNOBS)}")


def make_trace(config: CapstoneConfig, cost: CostModel, knob: str | None = None) -> Trace:
    """Serve the configuration's workload (optionally with ``knob`` turned)."""
    served_by = config if knob is None else with_knob(config, knob)
    return serve(served_by, workload(config, cost), cost)


# --- files -----------------------------------------------------------------------------------
MAX_MEDIAN_FIT_ERROR = 0.15   # a busier machine gives noisy steps and a poor fit; refuse it


def calibrate(out_dir: Path, force: bool = False) -> CostModel:
    """Measure the real model on this machine and store the fitted cost model.

    Step times measured while other programs compete for the CPU are noisy; a fit whose median
    error exceeds ``MAX_MEDIAN_FIT_ERROR`` is refused (rerun on a quiet machine, or ``force``).
    """
    from batchlab.backends import ModelBackend
    from batchlab.experiments.calibration import calibrate_cost_model
    from batchlab.model import load_model

    cost = calibrate_cost_model(ModelBackend(load_model(), num_slots=16, max_seq_len=512))
    error = cost.fit_stats["median_rel_error"]
    if error > MAX_MEDIAN_FIT_ERROR and not force:
        raise SystemExit(f"the fit's median error is {error:.0%} (over {MAX_MEDIAN_FIT_ERROR:.0%}): "
                         f"the machine was probably busy. {cost}. Rerun when it is quiet, or pass "
                         "--force to keep it anyway.")
    cost.save(out_dir / COST_MODEL_FILE)
    return cost


def write_traces(out_dir: Path = CAPSTONE_DIR, cost_dir: Path = CAPSTONE_DIR) -> list[Path]:
    """Write every configuration's trace to ``out_dir`` using ``cost_dir``'s cost model."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cost = CostModel.load(cost_dir / COST_MODEL_FILE)
    paths = []
    for config in CONFIGS:
        trace = make_trace(config, cost)
        meta = {"name": config.name, "made_by": "scripts/make_capstone_traces.py",
                "backend": "SimBackend (batchlab simulator)", "cost_model": COST_MODEL_FILE}
        paths.append(save_trace(trace, out_dir / f"{config.name}.json", meta=meta))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=CAPSTONE_DIR,
                        help="output folder (default: data/capstone/)")
    parser.add_argument("--calibrate", action="store_true",
                        help="measure a new cost model on the real model first (writes "
                             f"{COST_MODEL_FILE} into --out)")
    parser.add_argument("--force", action="store_true",
                        help="with --calibrate: keep the fit even if it is poor (a busy machine)")
    args = parser.parse_args()
    cost_dir = CAPSTONE_DIR
    if args.calibrate:
        args.out.mkdir(parents=True, exist_ok=True)
        print(calibrate(args.out, force=args.force))
        cost_dir = args.out
    for path in write_traces(args.out, cost_dir):
        print(f"{path}  ({path.stat().st_size / 1024:.1f} KB)")


if __name__ == "__main__":
    main()
