"""The server as a process: start it (a subprocess, or a thread of this one), wait until it
answers, stop it with a reason for the requests in flight.

The rules and their reasons: ``docs/serving-over-http.md``.
"""


from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from batchlab.checks import check_choice, fail
from batchlab.model.loading import ALLOWED_DTYPES
from batchlab.serve.config import ServerConfig
from batchlab.serve.runner import EngineRunner

HOST = "127.0.0.1"
SHUTDOWN_REASON = "server shutting down"
PARENT_ENV = "BATCHLAB_STOP_WITH_PARENT"     # set by launch_server: the pid the server stops without
_STARTED: dict[int, subprocess.Popen] = {}   # pid: every server process started here, not yet stopped


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


def _stop_with_parent() -> None:
    """In a server that ``launch_server`` started: SIGTERM itself once that parent is gone."""
    parent = os.environ.get(PARENT_ENV)
    if parent is None:
        return                                  # started by hand: it runs until stopped

    def watch() -> None:
        while str(os.getppid()) == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="batchlab-parent-watch", daemon=True).start()


def free_port(host: str = HOST) -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _uvicorn_server(runner: EngineRunner, host: str, port: int, api_key: str | None, log_level: str):
    import uvicorn

    from batchlab.serve.app import build_app

    class Server(uvicorn.Server):
        """uvicorn, except that a signal first stops admission and ends requests in flight with a
        stated reason, so their streams close with finish_reason "abort" instead of being cut."""

        def handle_exit(self, sig, frame) -> None:
            runner.shutdown(f"{SHUTDOWN_REASON} ({signal.Signals(sig).name})")
            super().handle_exit(sig, frame)

    config = uvicorn.Config(build_app(runner, api_key), host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=10, access_log=False)
    return Server(config)


def serve(config: ServerConfig, host: str = HOST, port: int = 8000, api_key: str | None = None,
          threads: int | None = None, log_level: str = "warning", lm=None, dtype: str = "auto") -> None:
    """Load the model (in ``dtype``, see ``load_model``) and serve until SIGTERM/SIGINT (blocks). The
    process's per-shape caches are bounded first (``memory.bound_shape_caches``): a server meets
    many step sizes."""
    from batchlab.model import load_model
    from batchlab.serve.memory import bound_shape_caches
    _stop_with_parent()
    bound_shape_caches()
    _log_to_stderr(log_level)
    if config.simulate is None:
        lm = lm if lm is not None else load_model(threads=threads, dtype=dtype)
    runner = EngineRunner(config, lm)
    server = _uvicorn_server(runner, host, port, api_key, log_level)
    on = lm.name if runner.device is None else f"a simulated device ({runner.device.spec}; placeholder tokens)"
    print(f"batchlab.serve: {runner.scheduler!r} on {on}, http://{host}:{port}", flush=True)
    server.run()


def _log_to_stderr(level: str) -> None:
    """The server's own lines (refused requests, ignored fields) beside uvicorn's, at its level."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(name)s: %(message)s"))
    log = logging.getLogger("batchlab")
    log.addHandler(handler)
    log.setLevel(level.upper())
    log.propagate = False


class ServerThread:
    """A server in this process, on a thread (for tests: the model is loaded once)."""

    def __init__(self, config: ServerConfig, lm, api_key: str | None = None, port: int | None = None) -> None:
        self.runner = EngineRunner(config, lm)
        self.port = port or free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.server = _uvicorn_server(self.runner, HOST, self.port, api_key, "warning")
        self.thread = threading.Thread(target=self.server.run, name="batchlab-http", daemon=True)

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        wait_healthy(self.url, 60, lambda: None if self.thread.is_alive() else "the server thread ended")
        return self

    def stop(self) -> None:
        self.runner.shutdown(SHUTDOWN_REASON)
        self.server.should_exit = True
        self.thread.join(30)
        if not self.thread.is_alive():
            self.runner.join()
            self.runner.release_memory()

    def __exit__(self, *exc) -> None:
        self.stop()


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


def wait_healthy(url: str, timeout: float, why_dead) -> None:
    import httpx
    deadline = time.monotonic() + timeout
    while True:
        dead = why_dead()
        if dead:
            raise RuntimeError(f"the server at {url} did not start: {dead}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server at {url} was not healthy after {timeout:.0f} s")
        time.sleep(0.2)


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
        log_path = tempfile.NamedTemporaryFile(prefix="batchlab-serve-", suffix=".log", delete=False).name
    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([package_root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env[PARENT_ENV] = str(os.getpid())
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    return ServerProcess(proc, f"http://{HOST}:{port}", log_path)


def wait_ready(server: ServerProcess, timeout: float = 120.0) -> None:
    """Wait until ``server`` answers ``/health``; stop it and raise, with its log, if it exits or
    does not answer within ``timeout`` seconds."""
    proc = server.proc

    def why_dead():
        if proc.poll() is None:
            return None
        return f"it exited with code {proc.returncode}:\n{server.log()[-3000:]}"

    try:
        wait_healthy(server.url, timeout, why_dead)
    except BaseException:
        server.stop()
        raise


__all__ = ["HOST", "SHUTDOWN_REASON", "ServerProcess", "ServerThread", "free_port", "launch_server", "serve",
           "start_server", "wait_healthy", "wait_ready"]
