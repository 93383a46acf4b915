"""What a server runs: its policy, vLLM's engine flags, the KV cache, admission (``ServerConfig``),
and the scheduler and model backend they make."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from batchlab.backends import ModelBackend
from batchlab.checks import check_bool, check_instance, check_int, fail, is_int
from batchlab.engine_args import EngineArgs, flag
from batchlab.schedulers import SCHEDULERS, DynamicBatcher, StaticBatcher
from batchlab.schedulers.continuous import batcher_for
from batchlab.schedulers.base import Scheduler
from batchlab.speculative import SpeculativeConfig, check_runs_on_the_model
from batchlab.serve.kv_transfer import KVTransferConfig
from batchlab.serve.simulated import SimulatedDevice

RELEASES = ("batch", "request")
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
# vLLM's flags the server honours, and its own values for those an EngineArgs leaves at None: a
# small batch and context (32 slots of 1,024 fp32 tokens are 1.5 GB), a budget small enough to show
# chunking, prefix caching off (it needs paged=True).
SERVER_ENGINE_FLAGS = ("max_num_seqs", "max_model_len", "max_num_batched_tokens",
                       "enable_chunked_prefill",
                       "long_prefill_token_threshold", "enable_prefix_caching", "block_size")
SERVER_DEFAULTS = EngineArgs(max_num_seqs=32, max_model_len=1024, max_num_batched_tokens=512,
                             enable_chunked_prefill=True, enable_prefix_caching=False,
                             block_size=16)


@dataclass(frozen=True)
class ServerConfig:
    """What the server runs: the policy and its knobs, vLLM's engine flags, the KV cache, admission.

    ``engine``: vLLM's flags (``EngineArgs``, those of ``SERVER_ENGINE_FLAGS``; each left at None
    takes ``SERVER_DEFAULTS``' value): ``max_num_seqs`` the most requests running at once, and
    the slot cache's slots; ``max_model_len`` tokens per slot; ``max_num_batched_tokens``,
    ``enable_chunked_prefill``, ``long_prefill_token_threshold`` the continuous batcher's step;
    ``block_size``, ``enable_prefix_caching`` a paged cache's.
    ``batch_size``: static. ``max_batch_size``, ``batch_timeout``: dynamic.
    ``release``: static and dynamic only: "batch" (a non-streaming server: every member's
    response is handed back when its batch ends, the course's default) or "request" (each member
    as it finishes, tokens streamed as computed).
    ``max_waiting``: requests waiting for admission before new ones get 429.
    ``paged``, ``kv_cache_memory_bytes``: the KV cache (``ModelBackend``'s arguments): slots by
    default, or blocks; a memory budget in bytes instead of ``max_num_seqs`` sequences.
    ``trace_window``: ended requests the engine's trace keeps (older ones are forgotten; the
    ``/metrics`` counters keep counting them).
    ``model_root``: what ``/v1/models`` reports as ``root`` (default: the tokenizer's folder).
    ``simulate``: None (the real model), or a simulated device's spec (``simulated.py``): steps
    last the time its cost model predicts and the generated tokens are placeholders. Parsed once,
    here, into ``device``.
    ``kv_transfer_config``: a ``KVTransferConfig`` (vLLM's ``--kv-transfer-config``): the server
    plays the prefill or decode part of disaggregated serving (``kv_transfer.py``); needs
    continuous batching on a paged cache.
    ``speculative_config``: a ``SpeculativeConfig`` (vLLM's ``--speculative-config``): speculative
    decoding by prompt lookup or an early exit (``batchlab.speculative``); needs continuous
    batching and the real model.
    """

    policy: str = "continuous"
    engine: EngineArgs = field(default_factory=EngineArgs)
    batch_size: int = 8
    max_batch_size: int = 8
    batch_timeout: float = 0.05
    release: str = "batch"
    max_waiting: int = 256
    model_name: str = DEFAULT_MODEL_NAME
    paged: bool = False
    kv_cache_memory_bytes: int | None = None
    trace_window: int = 10_000
    model_root: str | None = None
    simulate: str | None = None
    kv_transfer_config: KVTransferConfig | None = None
    speculative_config: SpeculativeConfig | None = None
    # simulate, parsed
    device: SimulatedDevice | None = field(init=False, default=None, repr=False, compare=False)

    @classmethod
    def of(cls, **knobs) -> "ServerConfig":
        """A config from flat knobs, each a field of ``ServerConfig`` or one of vLLM's flags
        (``ServerConfig.of(max_num_seqs=4, paged=True)``), as ``start_server`` takes them."""
        own = {f.name for f in dataclasses.fields(cls) if f.init and f.name != "engine"}
        for name, value in knobs.items():
            if name not in own and name not in SERVER_ENGINE_FLAGS:
                fail(name, value,
                     f"a ServerConfig field ({', '.join(sorted(own))}) or one of vLLM's flags the "
                     f"server takes ({', '.join(SERVER_ENGINE_FLAGS)})")
        engine = EngineArgs(**{k: v for k, v in knobs.items() if k in SERVER_ENGINE_FLAGS})
        return cls(engine=engine, **{k: v for k, v in knobs.items() if k in own})

    def __post_init__(self) -> None:
        check_instance("engine", self.engine, EngineArgs, "an EngineArgs")
        unhonoured = [f.name for f in dataclasses.fields(EngineArgs)
                      if f.name not in SERVER_ENGINE_FLAGS
                      and getattr(self.engine, f.name) not in (None, "auto")]
        if unhonoured:
            fail(unhonoured[0], getattr(self.engine, unhonoured[0]),
                 "None: batchlab's server takes only "
                 f"{', '.join(SERVER_ENGINE_FLAGS)} of vLLM's flags")
        object.__setattr__(self, "engine", self.engine.with_defaults(SERVER_DEFAULTS))
        self._check_policy()
        self._check_kv_cache()
        check_instance("kv_transfer_config", self.kv_transfer_config, KVTransferConfig,
                       "a KVTransferConfig",
                       allow_none=True, hint="KVTransferConfig.parse(text) reads vLLM's JSON")
        check_instance("speculative_config", self.speculative_config, SpeculativeConfig,
                       "a SpeculativeConfig",
                       allow_none=True, hint="SpeculativeConfig.parse(text) reads vLLM's JSON")
        if self.kv_transfer_config is not None:
            if self.policy != "continuous" or not self.paged:
                raise ValueError(f"kv_transfer_config with policy={self.policy!r}, "
                                 f"paged={self.paged}; must come with policy='continuous' and "
                                 "paged=True (the hand-off names KV blocks, as vLLM's)")
        spec = self.speculative_config
        if spec is not None:
            check_runs_on_the_model(spec)
            if self.policy != "continuous" or self.simulate is not None:
                raise ValueError(f"speculative_config with policy={self.policy!r}, "
                                 f"simulate={self.simulate!r}; must come with policy='continuous' "
                                 "(a request-level batch decodes in lockstep) and the real model "
                                 "(a simulated device has no tokens to draft from)")
            if spec.num_speculative_tokens >= self.engine.max_model_len:
                raise ValueError(f"num_speculative_tokens={spec.num_speculative_tokens}; must be "
                                 f"below max_model_len={self.engine.max_model_len}")

    def cli_args(self) -> list[str]:
        """``python -m batchlab.serve``'s arguments for this config (fields at their default left
        out)."""
        out: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not f.init or f.name == "engine" or value == f.default or value is False:
                continue
            if value is True:
                out.append(flag(f.name))
            else:
                out += [flag(f.name), value.to_json() if hasattr(value, "to_json") else str(value)]
        return out + self.engine.cli_args()

    def _check_policy(self) -> None:
        """The policy, its sizes and admission."""
        if self.policy not in SCHEDULERS:
            raise ValueError(f"policy={self.policy!r}; allowed: {list(SCHEDULERS)}")
        if self.release not in RELEASES:
            raise ValueError(f"release={self.release!r}; allowed: {list(RELEASES)}")
        for name in ("batch_size", "max_batch_size", "max_waiting"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValueError(f"{name}={value!r}; must be an int >= 1")
        if not (isinstance(self.batch_timeout, (int, float)) and self.batch_timeout >= 0):
            raise ValueError(f"batch_timeout={self.batch_timeout!r}; must be a number of "
                             "seconds >= 0")
        if self.policy == "static" and self.max_waiting < self.batch_size:
            raise ValueError(f"max_waiting={self.max_waiting} < batch_size={self.batch_size}: "
                             "a static batch could never fill; allow at least batch_size waiting "
                             "requests")
        if not isinstance(self.model_name, str) or not self.model_name:
            raise ValueError(f"model_name={self.model_name!r}; must be a non-empty string")
        check_bool("paged", self.paged)

    def _check_kv_cache(self) -> None:
        """The KV cache: its block size, size and kind, and a simulated device's room for it."""
        check_int("trace_window", self.trace_window, hint="ended requests the trace keeps")
        check_int("kv_cache_memory_bytes", self.kv_cache_memory_bytes, allow_none=True)
        if self.engine.enable_prefix_caching and not self.paged:
            raise ValueError("enable_prefix_caching=True; must come with paged=True "
                             "(prefix caching shares whole KV blocks)")
        if self.simulate is not None:
            # a bad spec fails here, once
            device = SimulatedDevice.parse(self.simulate)
            device.kv_capacity_tokens(self.kv_cache_memory_bytes, self.engine.max_num_seqs,
                                      self.engine.max_model_len)
            object.__setattr__(self, "device", device)

    def make_backend(self, lm) -> ModelBackend:
        e = self.engine
        return ModelBackend(lm, num_slots=e.max_num_seqs, max_seq_len=e.max_model_len,
                            kv_memory_bytes=self.kv_cache_memory_bytes, paged=self.paged,
                            block_size=e.block_size, enable_prefix_caching=e.enable_prefix_caching,
                            speculative_config=self.speculative_config)

    def make_scheduler(self) -> Scheduler:
        stream = self.release == "request"
        if self.policy == "static":
            return StaticBatcher(self.batch_size, stream=stream)
        if self.policy == "dynamic":
            return DynamicBatcher(self.max_batch_size, self.batch_timeout, stream=stream)
        return batcher_for(self.engine)
