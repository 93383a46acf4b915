"""vLLM beside the course, as the reference: its OpenAI server on the course's model, from its own venv.

- ``server.py``: ``start_vllm`` (vLLM's server as a subprocess on 127.0.0.1, waited for until it
  answers), ``vllm_status`` (is it set up?).
- ``bench.py``: ``vllm_bench_serve`` and ``VllmBench`` (vLLM's own benchmark client, its import
  paid once for several runs).
- ``flags.py``: ``FLAG_TABLE``, batchlab's knobs beside vLLM's flags, V1's defaults and SGLang's
  flags (the flags themselves: ``batchlab.engine_args.EngineArgs``, ``start_vllm(args)``).

It never imports vLLM into the course's process; ``batchlab.loadgen`` measures it from outside,
exactly as it measures batchlab's own server (``batchlab.serve``).
"""

from batchlab.vllm_ref.bench import VllmBench, vllm_bench_serve
from batchlab.vllm_ref.flags import FLAG_TABLE
from batchlab.vllm_ref.server import (COURSE_ARGS, SERVED_MODEL_NAME, SETUP_HINT, VLLMUnavailable, ensure_running, start_vllm,
                                      vllm_python, vllm_status)

__all__ = ["COURSE_ARGS", "FLAG_TABLE", "SERVED_MODEL_NAME", "SETUP_HINT", "VLLMUnavailable", "VllmBench", "ensure_running",
           "start_vllm", "vllm_bench_serve", "vllm_python", "vllm_status"]
