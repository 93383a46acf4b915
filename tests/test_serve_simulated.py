"""The server's simulated-device mode (``--simulate``): a real server subprocess, no model weights.

Small: one server, a few short requests. Step times are asserted loosely (the machine is shared):
a simulated decode step must last at least the cost model's prediction, since the wall clock
sleeps up to it, and not far beyond it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from batchlab.steptime.roofline import RooflineCostModel
from batchlab.serve import ServerConfig
from batchlab.launch import start_server
from batchlab.serve.simulated import PLACEHOLDER_TEXT, SimulatedDevice
from batchlab.vllm_sim import VllmReplica

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def sim_server():
    with start_server(simulate="L4", paged=True, enable_prefix_caching=True, max_num_seqs=16,
                      max_model_len=2048) as server:
        yield server


def test_the_model_card_and_every_response_say_the_tokens_are_placeholders(sim_server):
    card = httpx.get(f"{sim_server.url}/v1/models", timeout=10).json()["data"][0]["simulated_device"]
    assert card["spec"] == "L4" and card["shape"] == "Llama-3-8B" and "placeholder" in card["note"]
    r = httpx.post(f"{sim_server.url}/v1/completions", timeout=60,
                   json={"model": MODEL, "prompt": "Tell me about rivers.", "max_tokens": 6}).json()
    assert r["choices"][0]["text"] == PLACEHOLDER_TEXT * 6
    assert r["choices"][0]["finish_reason"] == "length" and r["batchlab"]["simulated"] == "L4"


def test_steps_last_the_predicted_time_and_prefix_caching_is_the_real_code(sim_server):
    model = SimulatedDevice.parse("L4").cost_model
    prompt = list(range(1000, 1000 + 320))                  # 20 whole blocks of 16
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 8}
    first = httpx.post(f"{sim_server.url}/v1/completions", json=body, timeout=60).json()["batchlab"]
    gaps = np.diff(first["token_times"])
    predicted = model.predict_features(1, 1, len(prompt) + 4)
    assert predicted * 0.98 <= np.median(gaps) <= predicted * 1.5 + 0.02, (gaps, predicted)
    stats_before = httpx.get(f"{sim_server.url}/metrics", timeout=10).text
    again = httpx.post(f"{sim_server.url}/v1/completions", json=body, timeout=60).json()["batchlab"]
    stats_after = httpx.get(f"{sim_server.url}/metrics", timeout=10).text

    def hits(text: str) -> float:
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("vllm:prefix_cache_hits"))
    assert hits(stats_after) - hits(stats_before) >= 304      # all but the last block found cached
    assert again["ttft_s"] < first["ttft_s"]                  # a 16-token prefill is shorter than 320


def test_get_load_answers_what_vllm_router_polls(sim_server):
    load = httpx.get(f"{sim_server.url}/get_load", timeout=10).json()
    assert load["load"] == 0 and set(load) >= {"num_reqs", "num_waiting_reqs"}


def test_router_added_fields_are_accepted(sim_server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "no_stop_trim": False, "separate_reasoning": True, "stream_reasoning": True,
            "return_hidden_states": False, "include_reasoning": True}
    assert httpx.post(f"{sim_server.url}/v1/chat/completions", json=body, timeout=60).status_code == 200


def test_placeholders_have_no_logprobs_and_min_tokens_is_kept(sim_server):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
    r = httpx.post(f"{sim_server.url}/v1/completions", json={**body, "logprobs": 1}, timeout=60)
    assert r.status_code == 400 and "placeholder" in r.json()["error"]["message"]
    r = httpx.post(f"{sim_server.url}/v1/completions", json={**body, "min_tokens": 4, "top_k": 3}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize("spec", ["X100", "Llama-9@H100", "H100@Llama-3-8B", "", "/nonexistent/model.json"])
def test_a_bad_simulate_spec_is_named_with_what_is_allowed(spec):
    with pytest.raises(ValueError, match="simulate=.*must be a GPU preset"):
        ServerConfig(simulate=spec)


def test_the_cli_refuses_a_bad_spec_before_loading_anything():
    out = subprocess.run([sys.executable, "-m", "batchlab.serve", "--simulate", "B300"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "simulate='B300'" in out.stderr and "H100" in out.stderr


def test_a_saved_cost_model_can_be_simulated(tmp_path):
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(RooflineCostModel.for_device("Llama-3-8B", "A100").to_dict()))
    device = SimulatedDevice.parse(str(path))
    assert device.shape.name == "Llama-3-8B" and device.cost_model == RooflineCostModel.for_device("Llama-3-8B", "A100")


def test_a_device_is_simulated_as_vllm_serves_it_and_refused_where_vllm_would():
    """A preset runs vLLM's step time on that GPU; a model whose weights overflow the card is refused."""
    device = SimulatedDevice.parse("Llama-2-7B@H100")
    assert device.cost_model == VllmReplica("Llama-2-7B", "H100").step_model
    with pytest.raises(ValueError, match=r"simulate='T4': vLLM would not serve it: weights=1\d\.\d GiB"):
        SimulatedDevice.parse("T4")


# --- a server never outlives the Python that started it ---------------------------------------------
def _ended(pid: int) -> bool:
    """The process is gone, or a zombie nobody has reaped yet (its parent exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _server_pid_after(ending: str) -> int:
    """Start a simulated server from a child Python that then ends with ``ending``; the server's pid."""
    code = ("import os, signal, sys\n"
            "from batchlab.launch import start_server\n"
            "server = start_server(simulate='L4', max_num_seqs=4, max_model_len=256)\n"
            "print(server.proc.pid, flush=True)\n" + ending)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    return int(done.stdout.split()[0])


@pytest.mark.parametrize("ending", ["sys.exit(0)", "os.kill(os.getpid(), signal.SIGKILL)"],
                         ids=["exits", "is-killed"])
def test_a_server_left_running_stops_when_the_python_that_started_it_ends(ending):
    # exits: stopped at exit (a script's end, a notebook kernel shut down); is-killed: no exit
    # hook runs, the server sees its parent gone and stops itself
    pid = _server_pid_after(ending)
    deadline = time.monotonic() + 30
    while not _ended(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _ended(pid), f"server {pid} still running after its parent ended ({ending})"


def test_the_server_shim_stops_its_server_once_the_python_that_started_it_is_killed():
    # SERVER_SHIM's watch, around a stand-in server (the standard library's); vLLM itself starts
    # through the shim in tests/test_vllm_ref.py
    from batchlab.serve.running import PARENT_ENV
    from batchlab.launch.vllm import SERVER_SHIM
    shim = SERVER_SHIM.replace("vllm.entrypoints.openai.api_server", "http.server")
    assert shim != SERVER_SHIM
    parent = ("import os, signal, subprocess, sys\n"                 # killed at once: no race either
              f"env = dict(os.environ, {PARENT_ENV}=str(os.getpid()))\n"
              f"p = subprocess.Popen([sys.executable, '-c', {shim!r}, '--bind', '127.0.0.1', '0'], env=env,\n"
              "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
              "print(p.pid, flush=True)\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL
    pid = int(done.stdout.split()[0])

    deadline = time.monotonic() + 20
    while not _ended(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _ended(pid), f"the stand-in server {pid} outlived its killed parent"
