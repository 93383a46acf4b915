"""The server running here: ``serve`` (blocks until a signal) or a ``ServerThread`` of this
process; each stops admission first and ends the requests in flight with a stated reason.

Starting it as a subprocess is ``batchlab.launch``'s job. The rules: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time

from batchlab.serve.config import ServerConfig
from batchlab.serve.runner import EngineRunner

HOST = "127.0.0.1"
SHUTDOWN_REASON = "server shutting down"
PARENT_ENV = "BATCHLAB_STOP_WITH_PARENT"     # set by launch_server: the parent's pid


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


def _uvicorn_server(runner: EngineRunner, host: str, port: int, api_key: str | None,
                    log_level: str):
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
          threads: int | None = None, log_level: str = "warning", lm=None,
          dtype: str = "auto") -> None:
    """Load the model (in ``dtype``, see ``load_model``) and serve until SIGTERM/SIGINT (blocks).
    The process's per-shape caches are bounded first (``memory.bound_shape_caches``): a server
    meets many step sizes."""
    from batchlab.model import load_model
    from batchlab.serve.memory import bound_shape_caches
    _stop_with_parent()
    bound_shape_caches()
    _log_to_stderr(log_level)
    if config.simulate is None:
        lm = lm if lm is not None else load_model(threads=threads, dtype=dtype)
    runner = EngineRunner(config, lm)
    server = _uvicorn_server(runner, host, port, api_key, log_level)
    on = (lm.name if runner.device is None
          else f"a simulated device ({runner.device.spec}; placeholder tokens)")
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

    def __init__(self, config: ServerConfig, lm, api_key: str | None = None,
                 port: int | None = None) -> None:
        self.runner = EngineRunner(config, lm)
        self.port = port or free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.server = _uvicorn_server(self.runner, HOST, self.port, api_key, "warning")
        self.thread = threading.Thread(target=self.server.run, name="batchlab-http", daemon=True)

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        alive = self.thread.is_alive
        wait_healthy(self.url, 60, lambda: None if alive() else "the server thread ended")
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


__all__ = ["HOST", "PARENT_ENV", "SHUTDOWN_REASON", "ServerThread", "free_port", "serve",
           "wait_healthy"]
