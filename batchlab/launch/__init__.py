"""Everything the course starts on 127.0.0.1 and tears down: batchlab's server as a subprocess,
vLLM's server and benchmark client from their own venv, and ``vllm-router`` in front of replicas.

- ``server.py``: ``start_server``, ``launch_server``, ``wait_ready`` (``python -m batchlab.serve``).
- ``vllm.py``: ``start_vllm`` (vLLM's OpenAI server on the course's model), ``vllm_status``.
- ``vllm_bench.py``: ``vllm_bench_serve`` and ``VllmBench`` (vLLM's own benchmark client).
- ``loopback.py``, ``pd_loopback.py``: the real router over simulated or split replicas;
  ``router_check.py`` compares it with ``batchlab.cluster``'s simulation.

Nothing here is imported by the simulation (``cluster/``) or the server itself (``serve/``).
"""

from batchlab.launch.server import ServerProcess, launch_server, start_server, wait_ready
from batchlab.launch.vllm import (COURSE_ARGS, SERVED_MODEL_NAME, SETUP_HINT, VLLMUnavailable,
                                  ensure_running, start_vllm, vllm_python, vllm_status)
from batchlab.launch.vllm_bench import VllmBench, vllm_bench_serve

__all__ = ["COURSE_ARGS", "SERVED_MODEL_NAME", "SETUP_HINT", "ServerProcess", "VLLMUnavailable",
           "VllmBench", "ensure_running", "launch_server", "start_server", "start_vllm",
           "vllm_bench_serve", "vllm_python", "vllm_status", "wait_ready"]
