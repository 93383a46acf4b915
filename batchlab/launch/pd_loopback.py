"""Prefill here, decode there, for real on loopback: ``vllm-router --vllm-pd-disaggregation`` in
front of batchlab servers playing the prefill and the decode part.

The rules and their reasons: ``docs/replicas-and-router.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from batchlab.checks import check_choice, check_int, check_number, fail
from batchlab.engine_args import EngineArgs
from batchlab.launch.loopback import (VLLM_ROUTER_POLICIES, RouterProcess, router_binary,
                                      start_pd_router)
from batchlab.model.loading import (ALLOWED_DTYPES, DTYPE_ENV, from_environment, resolve_device,
                                    resolve_dtype)
from batchlab.launch.server import ServerProcess, launch_server, wait_ready
from batchlab.serve.config import ServerConfig
from batchlab.serve.kv_transfer import CONNECTOR, KVTransferConfig

# The workers' vLLM flags where a PDLoopbackConfig's engine leaves them at None: a CPU-sized batch.
PD_ARGS = EngineArgs(max_num_seqs=8, max_model_len=1024, max_num_batched_tokens=512)


@dataclass(frozen=True)
class PDLoopbackConfig:
    """The two pools (sizes, routing policies), the workers' knobs, and the hand-off's settings.

    ``simulate``: None (the real model) or a ``--simulate`` spec. ``engine``: every worker's vLLM
    flags (each left at None takes ``PD_ARGS``' value; the block size is each pool's, below).
    ``prefill_block_size`` and
    ``decode_block_size``: each pool's KV block size (vLLM's rule: the decode one a multiple of
    the prefill one). ``failure_policy``: vLLM's ``kv_load_failure_policy``. ``link``: the link a
    simulated decode worker waits for (``KV_LINKS``). ``threads``: torch threads per worker.
    ``dtype``: every worker's ``--dtype``; ``auto`` is resolved once, here, as ``load_model`` would
    (a decode worker refuses KV of another dtype, so the workers must agree).
    """

    num_prefill: int = 1
    num_decode: int = 1
    simulate: str | None = None
    prefill_policy: str = "round_robin"
    decode_policy: str = "round_robin"
    engine: EngineArgs = PD_ARGS
    prefill_block_size: int = 16
    decode_block_size: int = 16
    failure_policy: str = "fail"
    lease_s: float = 30.0
    fetch_timeout_s: float = 30.0
    link: str = "infiniband-ndr"
    threads: int | None = None
    dtype: str = "auto"
    startup_timeout: float = 180.0

    def __post_init__(self) -> None:
        check_int("num_prefill", self.num_prefill, hint="the prefill pool cannot be empty")
        check_int("num_decode", self.num_decode, hint="the decode pool cannot be empty")
        check_choice("prefill_policy", self.prefill_policy, VLLM_ROUTER_POLICIES)
        check_choice("decode_policy", self.decode_policy, VLLM_ROUTER_POLICIES)
        check_int("threads", self.threads, allow_none=True)
        check_choice("dtype", self.dtype, ALLOWED_DTYPES)
        check_number("startup_timeout", self.startup_timeout, strict=True, hint="seconds")
        self.transfer_config("prefill")                       # the hand-off's own checks
        for pool in ("prefill", "decode"):
            self.worker_config(pool)                          # the server's own checks

    def transfer_config(self, pool: str) -> KVTransferConfig:
        extra = {"kv_lease_duration": self.lease_s, "kv_fetch_timeout": self.fetch_timeout_s,
                 "link": self.link}
        return KVTransferConfig(CONNECTOR, "kv_producer" if pool == "prefill" else "kv_consumer",
                                self.failure_policy, kv_connector_extra_config=extra)

    def resolved_dtype(self) -> str:
        """The workers' dtype: ``dtype``, or for ``auto`` what ``load_model`` picks on this
        machine."""
        return resolve_dtype(from_environment(self.dtype, DTYPE_ENV, ALLOWED_DTYPES),
                             resolve_device("auto"))

    def colocated_config(self, block_size: int | None = None) -> ServerConfig:
        """A worker's server without the hand-off (a colocated server)."""
        engine = replace(self.engine,
                         block_size=block_size or self.decode_block_size).with_defaults(PD_ARGS)
        return ServerConfig(engine=engine, paged=True, simulate=self.simulate)

    def worker_config(self, pool: str) -> ServerConfig:
        if pool not in ("prefill", "decode"):
            fail("pool", pool, "'prefill' or 'decode'")
        size = self.prefill_block_size if pool == "prefill" else self.decode_block_size
        return replace(self.colocated_config(size), kv_transfer_config=self.transfer_config(pool))


class PDLoopback:
    """The router and its two pools on 127.0.0.1 (see the module docstring); a context manager."""

    def __init__(self, config: PDLoopbackConfig | None = None) -> None:
        config = PDLoopbackConfig() if config is None else config
        if not isinstance(config, PDLoopbackConfig):
            fail("config", config, "a PDLoopbackConfig")
        self.config = config
        self.workers: dict[str, list[ServerProcess]] = {"prefill": [], "decode": []}
        self.router: RouterProcess | None = None

    @property
    def url(self) -> str:
        return self.router.url if self.router is not None else ""

    def urls(self, pool: str) -> list[str]:
        return [w.url for w in self.workers[pool]]

    def start(self) -> "PDLoopback":
        c = self.config
        binary, dtype = router_binary(), (None if c.simulate else c.resolved_dtype())
        try:
            # (each its own engine id)
            for pool, n in (("prefill", c.num_prefill), ("decode", c.num_decode)):
                self.workers[pool] = [launch_server(threads=c.threads, dtype=dtype,
                                                    config=c.worker_config(pool))
                                      for _ in range(n)]
            for pool, workers in self.workers.items():
                for i, worker in enumerate(workers):
                    try:
                        wait_ready(worker, c.startup_timeout)
                    except (RuntimeError, TimeoutError) as e:
                        raise RuntimeError(f"{pool} worker {i} ({worker.url}) did not become "
                                           f"healthy: {e}") from None
            self.router = start_pd_router(self.urls("prefill"), self.urls("decode"),
                                          c.prefill_policy, c.decode_policy,
                                          timeout=c.startup_timeout, binary=binary)
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self, pool: str, index: int) -> None:
        """SIGKILL worker ``index`` of ``pool`` (a crash: nothing ends gracefully)."""
        workers = self.workers.get(pool)
        if workers is None:
            fail("pool", pool, "'prefill' or 'decode'")
        if not (isinstance(index, int) and 0 <= index < len(workers)):
            fail("index", index, f"an int in 0..{len(workers) - 1}")
        workers[index].proc.kill()
        workers[index].proc.wait()

    def stop(self) -> None:
        if self.router is not None:
            self.router.stop()
        for workers in self.workers.values():
            for worker in workers:
                worker.stop()

    def __enter__(self) -> "PDLoopback":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        c = self.config
        return (f"PDLoopback({c.num_prefill}P:{c.num_decode}D, {c.simulate or 'the real model'}, "
                f"router={self.url or 'not started'})")


__all__ = ["PDLoopback", "PDLoopbackConfig"]
