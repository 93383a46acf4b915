"""A real router on loopback: ``vllm-router`` in front of N simulated-device batchlab replicas.

The rules and their reasons: ``docs/replicas-and-router.md``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from batchlab.checks import check_choice, check_int, check_number, fail
from batchlab.engine_args import EngineArgs
from batchlab.serve import HOST, wait_healthy, free_port
from batchlab.launch.server import ServerProcess, launch_server, wait_ready
from batchlab.serve.config import ServerConfig
from batchlab.serve.simulated import SimulatedDevice

# Every policy vllm-router 0.1.17 accepts (its --help): kv_aware scores workers by the KV they hold,
# from the KV events it is given (--kv-event-source; without events it sees no cache);
# sticky_least_loaded keeps a session on its replica and sends new ones to the least loaded.
VLLM_ROUTER_POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "consistent_hash",
                        "kv_aware", "sticky_least_loaded")
ROUTER_INSTALL = "pip install vllm-router==0.1.17 (requirements.txt pins it)"
# The replicas' vLLM flags where a LoopbackConfig's engine leaves them at None: a GPU-sized batch
# and context on a paged cache with prefix caching, as vLLM serves.
LOOPBACK_ARGS = EngineArgs(max_num_seqs=64, max_model_len=4096, max_num_batched_tokens=2048,
                           block_size=16, enable_prefix_caching=True)


def router_binary() -> str:
    """The ``vllm-router`` executable beside this Python, or on the PATH."""
    here = Path(sys.executable).parent / "vllm-router"
    found = str(here) if here.exists() else shutil.which("vllm-router")
    if found is None:
        raise RuntimeError(f"vllm-router is not installed in this environment ({sys.executable}); "
                           f"{ROUTER_INSTALL}")
    return found


@dataclass(frozen=True)
class LoopbackConfig:
    """The replicas (continuous batching on a simulated device, paged) and the router.

    ``engine``: every replica's vLLM flags; each left at None takes ``LOOPBACK_ARGS``' value.
    ``router_args``: more ``vllm-router`` flags, e.g. ``("--cache-threshold", "0.5")``.
    """

    num_replicas: int = 4
    policy: str = "cache_aware"
    simulate: str = "H100"
    engine: EngineArgs = LOOPBACK_ARGS
    kv_cache_memory_bytes: int | None = None
    router_args: tuple[str, ...] = field(default_factory=tuple)
    startup_timeout: float = 120.0

    def __post_init__(self) -> None:
        check_int("num_replicas", self.num_replicas, hint="a router needs at least one replica")
        check_choice("policy", self.policy, VLLM_ROUTER_POLICIES)
        if self.policy == "power_of_two" and self.num_replicas < 2:
            raise ValueError(f"num_replicas={self.num_replicas}; policy 'power_of_two' needs at "
                             "least 2 (vllm-router refuses fewer)")
        check_number("startup_timeout", self.startup_timeout, strict=True, hint="seconds")
        if not all(isinstance(a, str) for a in self.router_args):
            raise ValueError(f"router_args={self.router_args!r}; must be a tuple of strings "
                             "(vllm-router flags)")
        object.__setattr__(self, "replica",
                           ServerConfig(engine=self.engine.with_defaults(LOOPBACK_ARGS), paged=True,
                                                         simulate=self.simulate,
                                                         kv_cache_memory_bytes=self.kv_cache_memory_bytes))

    # Set in __post_init__: every replica's server, checked as the server checks it (the simulate
    # spec parsed once, its device in replica.device).
    replica: ServerConfig = field(init=False, repr=False, compare=False)

    def device(self) -> SimulatedDevice:
        return self.replica.device

    def kv_capacity_tokens(self) -> int:
        e = self.replica.engine
        return self.device().kv_capacity_tokens(self.kv_cache_memory_bytes, e.max_num_seqs,
                                                e.max_model_len)


class LoopbackCluster:
    """``vllm-router`` and its replicas on 127.0.0.1 (see the module docstring); a context
    manager."""

    def __init__(self, config: LoopbackConfig) -> None:
        if not isinstance(config, LoopbackConfig):
            raise ValueError(f"config={config!r}; must be a LoopbackConfig")
        self.config = config
        self.replicas: list[ServerProcess] = []
        self.router: RouterProcess | None = None
        self.policy = config.policy

    @property
    def url(self) -> str:
        return self.router.url if self.router is not None else ""

    @property
    def replica_urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def start(self) -> "LoopbackCluster":
        c = self.config
        binary = router_binary()
        try:
            self.replicas = [launch_server(config=c.replica) for _ in range(c.num_replicas)]
            for i, replica in enumerate(self.replicas):
                try:
                    wait_ready(replica, c.startup_timeout)
                except (RuntimeError, TimeoutError) as e:
                    raise RuntimeError(f"replica {i} ({replica.url}) did not become healthy: "
                                       f"{e}") from None
            self.router = start_router(self.replica_urls, self.policy, c.router_args,
                                       c.startup_timeout, binary)
        except BaseException:
            self.stop()
            raise
        return self

    def use_policy(self, policy: str) -> None:
        """Restart the router alone with another policy; the replicas (and their caches) stay."""
        check_choice("policy", policy, VLLM_ROUTER_POLICIES)
        if policy == "power_of_two" and self.config.num_replicas < 2:
            fail("policy", policy,
                 "a policy other than 'power_of_two' with one replica (vllm-router refuses it)")
        if self.router is not None:
            self.router.stop()
        self.policy = policy
        self.router = start_router(self.replica_urls, policy, self.config.router_args,
                                   self.config.startup_timeout)

    def kill_replica(self, index: int) -> None:
        """SIGKILL replica ``index`` (a crash: no graceful end for its requests)."""
        if not (isinstance(index, int) and 0 <= index < len(self.replicas)):
            raise ValueError(f"index={index!r}; must be an int in 0..{len(self.replicas) - 1}")
        proc = self.replicas[index].proc
        proc.kill()
        proc.wait()

    def stop(self) -> None:
        if self.router is not None:
            self.router.stop()
        for replica in self.replicas:
            replica.stop()

    def __enter__(self) -> "LoopbackCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class RouterProcess:
    """A started ``vllm-router``: its process, URL and log."""

    proc: subprocess.Popen
    url: str
    log_path: str
    metrics_url: str | None = None      # the router's own Prometheus endpoint

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace")

    def metrics(self):
        """The router's own metrics (``vllm_router_*``) as ``loadgen.prom.parse_metrics`` rows."""
        from batchlab.loadgen.prom import scrape
        if self.metrics_url is None:
            raise ValueError("metrics_url=None; must be set: this router was started with its "
                             "metrics off")
        return scrape(self.metrics_url)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_router(worker_urls: list[str], policy: str = "cache_aware",
                 router_args: tuple[str, ...] = (),
                 timeout: float = 120.0, binary: str | None = None) -> RouterProcess:
    """Start ``vllm-router`` on a free 127.0.0.1 port in front of ``worker_urls`` (each checked
    first: one that does not answer ``/health`` is named) and wait until it is ready."""
    check_choice("policy", policy, VLLM_ROUTER_POLICIES)
    if not worker_urls:
        raise ValueError(f"worker_urls={worker_urls!r}; must name at least one replica")
    for url in worker_urls:
        check_replica(url)
    return _launch_router(["--policy", policy, "--worker-urls", *worker_urls], router_args, timeout,
                          binary)


def start_pd_router(prefill_urls: list[str], decode_urls: list[str],
                    prefill_policy: str = "round_robin",
                    decode_policy: str = "round_robin", router_args: tuple[str, ...] = (),
                    timeout: float = 120.0, binary: str | None = None) -> RouterProcess:
    """Start ``vllm-router --vllm-pd-disaggregation`` in front of prefill and decode workers
    (servers started with ``--kv-transfer-config``; each checked first) and wait until it is
    ready."""
    check_choice("prefill_policy", prefill_policy, VLLM_ROUTER_POLICIES)
    check_choice("decode_policy", decode_policy, VLLM_ROUTER_POLICIES)
    for name, urls in (("prefill_urls", prefill_urls), ("decode_urls", decode_urls)):
        if not urls:
            raise ValueError(f"{name}={urls!r}; must name at least one worker (a pool cannot "
                             "be empty)")
        for url in urls:
            check_replica(url)
    pools = ([a for url in prefill_urls for a in ("--prefill", url)]
             + [a for url in decode_urls for a in ("--decode", url)])
    return _launch_router(["--vllm-pd-disaggregation", *pools, "--prefill-policy", prefill_policy,
                           "--decode-policy", decode_policy], router_args, timeout, binary)


def _launch_router(workers: list[str], router_args: tuple[str, ...], timeout: float,
                   binary: str | None) -> RouterProcess:
    """Start the router with ``workers`` (its worker and policy flags) on a free port, and wait."""
    binary = binary or router_binary()
    port = free_port()
    log_path = tempfile.NamedTemporaryFile(prefix="vllm-router-", suffix=".log", delete=False).name
    cmd = [binary, "--host", HOST, "--port", str(port), *workers,
           "--worker-startup-timeout-secs", str(int(timeout)), "--log-level", "warning"]
    metrics_url = None
    if "--prometheus-port" not in router_args:        # a port of its own, so routers never collide
        metrics_port = free_port()
        cmd += ["--prometheus-host", HOST, "--prometheus-port", str(metrics_port)]
        metrics_url = f"http://{HOST}:{metrics_port}"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([*cmd, *router_args], stdout=log, stderr=subprocess.STDOUT)
    router = RouterProcess(proc, f"http://{HOST}:{port}", log_path, metrics_url)
    wait_router(router.url, proc, log_path, timeout)
    return router


def wait_router(url: str, proc: subprocess.Popen, log_path: str, timeout: float) -> None:
    """Wait until the router answers ``GET /health`` with 200 (it does once every worker is
    healthy); a RuntimeError with its log if it exits, a TimeoutError if it never answers."""

    def why_dead() -> str | None:
        if proc.poll() is None:
            return None
        tail = "\n".join(Path(log_path).read_text(errors="replace").splitlines()[-12:])
        return f"vllm-router exited with code {proc.returncode} before it was ready:\n{tail}"

    try:
        wait_healthy(url, timeout, why_dead)
    except TimeoutError:
        proc.kill()
        raise


def check_replica(url: str, timeout: float = 5.0) -> None:
    """A ValueError naming ``url`` unless it answers ``GET /health`` with 200."""
    import httpx
    try:
        status = httpx.get(f"{url.rstrip('/')}/health", timeout=timeout).status_code
    except httpx.HTTPError as e:
        raise ValueError(f"replica url={url!r} does not answer GET /health "
                         f"({type(e).__name__}: {e}); must be a running server") from None
    if status != 200:
        raise ValueError(f"replica url={url!r} answers GET /health with HTTP {status}; "
                         "must answer 200")


__all__ = ["LoopbackCluster", "LoopbackConfig", "VLLM_ROUTER_POLICIES", "RouterProcess",
           "check_replica", "router_binary", "start_pd_router", "start_router", "wait_router"]
