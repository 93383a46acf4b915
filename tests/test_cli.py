"""Every command the README's "Serving over HTTP" block shows, run as written (through
``python -m``), with only a free port, one torch thread and a few requests added: the first
server answers every load command, each other one a closed loop of 8 users (a static batch of 8
fills only with 8 requests at once), and every server stops cleanly on SIGTERM."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from batchlab.serve import HOST, free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
SMALL_LOAD = ["--num-prompts", "8", "--input-len", "16", "--output-len", "4", "--disable-tqdm"]


def readme_commands() -> list[list[str]]:
    """The first code block after the heading "## Serving over HTTP", one command per line."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Serving over HTTP"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line.split("#")[0]) for line in block.splitlines() if "-m batchlab." in line]


def python_m(cmd: list[str]) -> list[str]:
    """``.venv/bin/python -m ...`` with this interpreter."""
    assert cmd[0].endswith("python") and cmd[1] == "-m", cmd
    return [sys.executable, *cmd[1:]]


SERVERS = [c for c in readme_commands() if c[2] == "batchlab.serve"]
LOADS = [c for c in readme_commands() if c[2] == "batchlab.loadgen"]


def test_the_readme_shows_servers_and_loads():
    assert len(SERVERS) >= 2 and len(LOADS) >= 3


@pytest.mark.parametrize("server_cmd", SERVERS, ids=[" ".join(c[3:]) for c in SERVERS])
def test_readme_server_commands_serve_the_readme_loads(server_cmd, tmp_path):
    port = free_port()
    url = f"http://{HOST}:{port}"
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(python_m(server_cmd) + ["--port", str(port), "--threads", "1"], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(url, 120, lambda: None if proc.poll() is None else f"exited {proc.returncode}")
        loads = LOADS if server_cmd is SERVERS[0] else [c for c in LOADS if "--concurrency" in c]
        assert loads
        for load in loads:
            cmd = [url if arg == "http://127.0.0.1:8000" else arg for arg in python_m(load)] + SMALL_LOAD
            for flag in ("--out", "--result-dir"):          # results in this test's folder
                if flag in cmd:
                    cmd[cmd.index(flag) + 1] = str(tmp_path / "out")
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"{' '.join(load)}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            assert "8/8 finished" in done.stdout
        assert httpx.get(f"{url}/metrics", timeout=10).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code in (0, -15) and "Traceback" not in (tmp_path / "server.log").read_text()
