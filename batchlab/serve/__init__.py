"""batchlab as a real server: OpenAI-compatible HTTP over the online engine.

The rules and their reasons: ``docs/serving-over-http.md``. As a subprocess: ``batchlab.launch``.
"""

from batchlab.serve.config import DEFAULT_MODEL_NAME, ServerConfig
from batchlab.serve.runner import EngineRunner
from batchlab.serve.running import (HOST, SHUTDOWN_REASON, ServerThread, free_port, serve,
                                    wait_healthy)

__all__ = ["DEFAULT_MODEL_NAME", "HOST", "SHUTDOWN_REASON", "EngineRunner", "ServerConfig",
           "ServerThread", "free_port", "serve", "wait_healthy"]
