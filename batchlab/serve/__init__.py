"""batchlab as a real server: OpenAI-compatible HTTP over the online engine.

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from batchlab.serve.processes import (HOST, SHUTDOWN_REASON, ServerProcess, ServerThread, free_port,
                                       launch_server, serve, start_server, wait_healthy, wait_ready)
from batchlab.serve.config import DEFAULT_MODEL_NAME, ServerConfig
from batchlab.serve.runner import EngineRunner

__all__ = ["DEFAULT_MODEL_NAME", "HOST", "SHUTDOWN_REASON", "EngineRunner", "ServerConfig", "ServerProcess",
           "ServerThread", "free_port", "launch_server", "serve", "start_server", "wait_healthy", "wait_ready"]
