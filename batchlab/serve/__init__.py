"""batchlab as a real server: OpenAI-compatible HTTP over the online engine.

- ``protocol.py``: the wire format's fields, errors (4xx naming the field) and shared checks.
- ``parsing.py``: request bodies into validated requests; ``responses.py``: OpenAI-style bodies.
- ``config.py``: ``ServerConfig``, what the server runs, and the scheduler and backend it makes.
- ``runner.py``: ``EngineRunner``, the engine thread and admission (429).
- ``bridge.py``: each engine step's output as typed events on a request's queue, and ``/metrics`` fed.
- ``app.py``: the FastAPI app: its lifespan, the API key, ``X-Request-Id`` echoed, errors.
- ``routes.py``: the routes (``/v1/completions``, ``/tokenize``, ``/metrics``, ...).
- ``streaming.py``: one response as its events arrive: streamed (SSE) or whole; disconnects.
- ``detok.py``: the incremental detokenizer, with stop strings held back.
- ``metrics.py``: ``/metrics`` in Prometheus' text format with vLLM's metric names.
- ``simulated.py``: ``--simulate SPEC``, the same server on a simulated device (placeholder tokens).
- ``engine_view.py``: what the server reads from the engine (end states, queue and KV numbers),
  and the trace window that bounds a long-running server's memory.
- ``processes.py``: the server as a process: start it, wait until it answers, stop it.
- ``kv_transfer.py``, ``kv_connector.py``: disaggregated serving's KV hand-off between two servers.

Beside it, not in it: the load client and the tools that read any server from outside
(``batchlab.loadgen``: ``prom``, ``soak``), vLLM's server as the reference (``batchlab.vllm_ref``),
and the real router in front of several servers (``batchlab.cluster.loopback``).

Run it with ``python -m batchlab.serve`` (see ``__main__.py``), or from a notebook::

    with start_server(policy="continuous", max_num_seqs=16) as server:
        ...  # server.url is "http://127.0.0.1:<port>"; load it with batchlab.loadgen

``start_server`` runs the server in a subprocess (its own Python, its own engine thread) and waits
until ``/health`` answers; ``stop()`` sends SIGTERM, which ends requests in flight with a reason.
``ServerThread`` runs one in this process instead (the tests use it, to share a loaded model).
"""

from batchlab.serve.processes import (HOST, SHUTDOWN_REASON, ServerProcess, ServerThread, free_port,
                                       launch_server, serve, start_server, wait_healthy, wait_ready)
from batchlab.serve.config import DEFAULT_MODEL_NAME, ServerConfig
from batchlab.serve.runner import EngineRunner

__all__ = ["DEFAULT_MODEL_NAME", "HOST", "SHUTDOWN_REASON", "EngineRunner", "ServerConfig", "ServerProcess",
           "ServerThread", "free_port", "launch_server", "serve", "start_server", "wait_healthy", "wait_ready"]
