"""batchlab's server as a subprocess on 127.0.0.1: start it, wait until it answers, stop it with a
reason for the requests in flight (and every one still running when this process exits).

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from batchlab.checks import check_choice, fail
from batchlab.model.loading import ALLOWED_DTYPES
from batchlab.serve.config import ServerConfig
from batchlab.serve.running import HOST, PARENT_ENV, free_port, wait_healthy

_STARTED: dict[int, subprocess.Popen] = {}   # pid: each server started here and not yet stopped


@atexit.register
def _stop_started(timeout: float = 15.0) -> None:
    """At exit: SIGTERM every server still running (each ends its requests with a reason), then
    wait for them together; SIGKILL what is left after ``timeout`` seconds."""
    procs = [p for p in _STARTED.values() if p.poll() is None]
    for p in procs:
        p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    _STARTED.clear()


class ServerProcess:
    """A server started by ``start_server``: ``url``, ``stop()``, ``log()``; a context manager."""

    def __init__(self, proc: subprocess.Popen, url: str, log_path: str) -> None:
        self.proc, self.url, self.log_path = proc, url, log_path
        _STARTED[proc.pid] = proc                # stopped at exit if nobody stops it before

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (requests in flight end with a stated reason), then wait; SIGKILL if it hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        _STARTED.pop(self.proc.pid, None)
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_server(policy: str = "continuous", port: int | None = None, api_key: str | None = None,
                 threads: int | None = None, timeout: float = 120.0, log_path: str | None = None,
                 dtype: str | None = None, **knobs) -> ServerProcess:
    """Start ``python -m batchlab.serve`` on 127.0.0.1 in a subprocess and wait until it is healthy.

    ``knobs`` are ``ServerConfig`` fields or the vLLM flags it takes (``max_num_seqs=16``,
    ``batch_size=8``, ``simulate="H100"``, ...: ``ServerConfig.of``), checked here before anything
    starts. The server's output goes to ``log_path`` (a temporary file by default). ``dtype``: the
    model's (``load_model``); None: the server's default.
    """
    server = launch_server(policy, port, api_key, threads, log_path, dtype, **knobs)
    wait_ready(server, timeout)
    return server


def launch_server(policy: str = "continuous", port: int | None = None, api_key: str | None = None,
                  threads: int | None = None, log_path: str | None = None, dtype: str | None = None,
                  config: ServerConfig | None = None, **knobs) -> ServerProcess:
    """``start_server`` without the wait: the process is started and returned at once (start
    several, then ``wait_ready`` each, and they load side by side). ``config``: a ``ServerConfig``
    instead of ``policy`` and ``knobs``. ``dtype``: the server's ``--dtype`` (None: ``auto``)."""
    import tempfile
    if config is None:
        config = ServerConfig.of(policy=policy, **knobs)  # bad knobs fail here, with the reason
    elif knobs or not isinstance(config, ServerConfig):
        fail("config", config, "a ServerConfig, given alone (no knobs beside it)")
    if dtype is not None:
        check_choice("dtype", dtype, ALLOWED_DTYPES)
    port = port or free_port()
    cmd = [sys.executable, "-m", "batchlab.serve", "--port", str(port), *config.cli_args()]
    if api_key is not None:
        cmd += ["--api-key", api_key]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    if dtype is not None:
        cmd += ["--dtype", dtype]
    if log_path is None:
        log_path = tempfile.NamedTemporaryFile(prefix="batchlab-serve-", suffix=".log",
                                               delete=False).name
    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = [package_root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env[PARENT_ENV] = str(os.getpid())
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    return ServerProcess(proc, f"http://{HOST}:{port}", log_path)


def wait_ready(server: ServerProcess, timeout: float = 120.0,
               on_exit: Callable[[int], str] | None = None) -> None:
    """Wait until ``server`` answers ``/health``; stop it and raise, with its log, if it exits or
    does not answer within ``timeout`` seconds. ``on_exit(code)`` words an exit (default: the
    code and the log's end)."""
    proc = server.proc

    def why_dead():
        if proc.poll() is None:
            return None
        if on_exit is not None:
            return on_exit(proc.returncode)
        return f"it exited with code {proc.returncode}:\n{server.log()[-3000:]}"

    try:
        wait_healthy(server.url, timeout, why_dead)
    except BaseException:
        server.stop()
        raise


__all__ = ["ServerProcess", "launch_server", "start_server", "wait_ready"]
