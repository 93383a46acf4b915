"""EngineArgs: vLLM's flags by vLLM's names, written to and read from a command line without loss,
and the server's config built from them on both sides of a process boundary."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from batchlab.engine_args import EngineArgs
from batchlab.serve.__main__ import parse_args, server_config
from batchlab.serve.config import SERVER_DEFAULTS, SERVER_ENGINE_FLAGS, ServerConfig
from batchlab.serve.kv_transfer import CONNECTOR, KVTransferConfig
from batchlab.shapes import model_shape
from batchlab.speculative import SpeculativeConfig

SET = EngineArgs(max_num_seqs=6, max_num_batched_tokens=96, max_model_len=300, enable_chunked_prefill=False,
                 enable_prefix_caching=True, block_size=32, gpu_memory_utilization=0.8, dtype="bfloat16",
                 enforce_eager=True, async_scheduling=False, enable_expert_parallel=True, disable_log_stats=True)


@pytest.mark.parametrize("args", [EngineArgs(), SET, EngineArgs(enable_chunked_prefill=True, async_scheduling=True,
                                                                long_prefill_token_threshold=64)])
def test_the_command_line_reads_back_what_it_wrote(args):
    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_flags(parser)
    assert EngineArgs.from_cli(parser.parse_args(args.cli_args())) == args


def test_flags_at_vllms_default_are_left_off_and_off_by_default_flags_have_no_negation():
    assert EngineArgs().cli_args() == []
    assert EngineArgs(enforce_eager=False, disable_log_stats=False).cli_args() == []
    assert EngineArgs(enable_prefix_caching=False).cli_args() == ["--no-enable-prefix-caching"]


def test_resolved_fills_v1s_gpu_defaults_and_keeps_what_was_set():
    llama = model_shape("Llama-3-8B")
    big, small = EngineArgs().resolved("H100", 79.2, llama), EngineArgs().resolved("A100", 79.2, llama)
    assert (big.max_num_seqs, big.max_num_batched_tokens, small.max_num_seqs, small.max_num_batched_tokens) == (
        1024, 8192, 256, 2048)
    assert big.enable_chunked_prefill and big.enable_prefix_caching and big.async_scheduling and not big.enforce_eager
    assert big.block_size == 16 and big.dtype == "bfloat16"
    kept = EngineArgs(max_num_seqs=64, enable_prefix_caching=False).resolved("H100", 79.2, llama)
    assert (kept.max_num_seqs, kept.enable_prefix_caching) == (64, False)
    capped = EngineArgs(max_num_batched_tokens=512).resolved("H100", 79.2, llama)   # vLLM's default capped by it
    assert (capped.max_num_seqs, capped.max_num_batched_tokens) == (512, 512)
    with pytest.raises(ValueError, match="max_num_batched_tokens=512; must be >= max_num_seqs=1024"):
        EngineArgs(max_num_seqs=1024, max_num_batched_tokens=512)                  # both given: refused, as vLLM does
    with pytest.raises(ValueError, match="dtype='float32'"):
        EngineArgs(dtype="float32").resolved("H100", 79.2, llama)


def test_with_defaults_fills_only_what_is_none():
    filled = EngineArgs(max_num_seqs=4, enable_prefix_caching=False).with_defaults(SERVER_DEFAULTS)
    assert (filled.max_num_seqs, filled.enable_prefix_caching, filled.max_num_batched_tokens) == (4, False, 512)


@pytest.mark.parametrize("kwargs, named", [({"max_num_seqs": 0}, "max_num_seqs=0"),
                                           ({"block_size": 0}, "block_size=0"),
                                           ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization=1.5"),
                                           ({"enforce_eager": "yes"}, "enforce_eager='yes'"),
                                           ({"long_prefill_token_threshold": 8, "enable_chunked_prefill": False},
                                            "long_prefill_token_threshold=8")])
def test_bad_engine_args_are_named(kwargs, named):
    with pytest.raises(ValueError, match=named):
        EngineArgs(**kwargs)


def test_a_server_config_crosses_the_command_line_unchanged():
    """What ``launch_server`` writes, ``python -m batchlab.serve`` reads back into the same config:
    vLLM's flags among the server's own, the model's --dtype apart from theirs."""
    transfer = KVTransferConfig(CONNECTOR, "kv_producer", "fail")
    configs = [ServerConfig(),
               ServerConfig.of(policy="dynamic", max_batch_size=4, batch_timeout=0.2, release="request", max_num_seqs=4),
               ServerConfig.of(max_num_seqs=4, max_model_len=256, paged=True, block_size=32, enable_prefix_caching=True,
                               enable_chunked_prefill=False, max_num_batched_tokens=256, kv_transfer_config=transfer,
                               max_waiting=9, trace_window=50),
               ServerConfig.of(max_num_seqs=4, max_model_len=512, long_prefill_token_threshold=64,
                               speculative_config=SpeculativeConfig(3, prompt_lookup_min=2)),
               ServerConfig.of(simulate="L4", paged=True, max_num_seqs=4, kv_cache_memory_bytes=1 << 28)]
    for config in configs:
        back = server_config(parse_args([*config.cli_args(), "--dtype", "float32"]))
        assert back == config, config.cli_args()


def test_server_knobs_are_split_by_name_and_vllms_other_flags_refused():
    config = ServerConfig.of(max_num_seqs=4, paged=True)
    assert config.engine.max_num_seqs == 4 and config.paged and config.engine.max_model_len == 1024
    assert set(SERVER_ENGINE_FLAGS) < {f.name for f in dataclasses.fields(EngineArgs)}
    with pytest.raises(ValueError, match="max_seqs=4; must be a ServerConfig field"):
        ServerConfig.of(max_seqs=4)
    with pytest.raises(ValueError, match="enforce_eager=True; must be None: batchlab's server takes only"):
        ServerConfig(engine=EngineArgs(enforce_eager=True))
