"""AIPerf, NVIDIA's benchmark client for OpenAI-compatible servers, unchanged, against batchlab's server.

AIPerf 0.13 runs from its own venv (``.venv-aiperf/``, set up by ``scripts/setup_aiperf.sh``) as a
user runs it: ``aiperf profile --url ... --model ...``, the tokenizer read from the folder the
server's ``/v1/models`` names as the model's ``root`` (a local folder: nothing is downloaded).
Two scenarios:

- plain: completions, not streamed, AIPerf's synthetic prompts; every request succeeds.
- its tutorial's ``--extra-inputs min_tokens:8``, streamed chat, with a ``logit_bias`` of +100 on
  the end-of-sequence token ``<|im_end|>`` (id 2) so that the model would end at once: with
  ``min_tokens`` the end token is masked until 8 tokens are out, so every response is exactly
  9 tokens by the server's count (8, then the end token, which vLLM counts too). A server that
  ignored ``min_tokens`` would answer 1 token; one that ignored ``logit_bias``, 64.

Skipped (with the command to set it up) where AIPerf's venv is missing; a failure in CI.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from batchlab.loadgen.prom import scrape, value
from batchlab.launch import start_server

AIPERF = Path(__file__).resolve().parents[1] / ".venv-aiperf" / "bin" / "aiperf"
EOS = 2                                             # <|im_end|>, SmolLM2-Instruct's end of a turn


@pytest.fixture(scope="module")
def server():
    if not AIPERF.is_file():
        message = f"AIPerf is not set up ({AIPERF} is missing): run bash scripts/setup_aiperf.sh"
        if os.environ.get("CI"):
            pytest.fail(f"CI sets AIPerf up through scripts/test.sh, but: {message}")
        pytest.skip(message)
    with start_server(max_num_seqs=4, max_model_len=256, threads=1) as s:
        yield s


def aiperf(url: str, out: Path, *args: str) -> tuple[dict, list[dict], list[dict]]:
    """``aiperf profile`` against ``url`` with the server's model and tokenizer; returns its
    summary (``profile_export_aiperf.json``), its per-request records and the bodies it sent."""
    model = httpx.get(f"{url}/v1/models").json()["data"][0]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    cmd = [str(AIPERF), "profile", "--url", url, "--model", model["id"], "--tokenizer", model["root"],
           "--synthetic-input-tokens-mean", "32", "--synthetic-input-tokens-stddev", "0",
           "--random-seed", "0", "--ui-type", "none", "--artifact-dir", str(out), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=out.parent)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    summary = json.loads((out / "profile_export_aiperf.json").read_text())
    records = [json.loads(line) for line in (out / "profile_export.jsonl").read_text().splitlines()]
    bodies = [p for s in json.loads((out / "inputs.json").read_text())["data"] for p in s["payloads"]]
    return summary, records, bodies


def successes(url: str) -> float:
    return value(scrape(url), "vllm:request_success")


def test_aiperf_plain_completions(server, tmp_path):
    before = successes(server.url)
    summary, records, _ = aiperf(server.url, tmp_path / "plain", "--endpoint-type", "completions",
                                 "--output-tokens-mean", "8", "--request-count", "8", "--concurrency", "4")
    assert summary["error_summary"] == [], summary["error_summary"]
    assert summary["completed_request_count"]["avg"] == len(records) == 8
    assert successes(server.url) - before == 8


def test_aiperf_tutorial_min_tokens_with_a_biased_end_token(server, tmp_path):
    before = successes(server.url)
    summary, records, bodies = aiperf(
        server.url, tmp_path / "min_tokens", "--endpoint-type", "chat", "--streaming",
        "--output-tokens-mean", "64", "--request-count", "16", "--concurrency", "4", "--use-server-token-count",
        "--extra-inputs", "min_tokens:8", "--extra-inputs", json.dumps({"logit_bias": {str(EOS): 100}}))
    assert all(b["min_tokens"] == 8 and b["logit_bias"] == {str(EOS): 100} for b in bodies)   # sent as asked
    assert summary["error_summary"] == [], summary["error_summary"]
    assert summary["completed_request_count"]["avg"] == len(records) == 16
    lengths = [r["metrics"]["output_sequence_length"]["value"] for r in records]
    assert lengths == [9] * 16, lengths
    assert successes(server.url) - before == 16
