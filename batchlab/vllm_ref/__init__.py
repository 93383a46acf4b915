"""vLLM beside the course, as the reference: its OpenAI server on the course's model, from its own venv.

- ``server.py``: ``start_vllm`` (vLLM's server as a subprocess on 127.0.0.1, waited for until it
  answers), ``vllm_status`` (is it set up?).
- ``bench.py``: ``vllm_bench_serve`` and ``VllmBench`` (vLLM's own benchmark client, its import
  paid once for several runs).
- ``flags.py``: ``VLLMFlags``, the scheduling knobs ``start_vllm(flags=...)`` passes by vLLM's names,
  and ``FLAG_TABLE``: batchlab's knobs beside vLLM's flags, V1's defaults and SGLang's flags.

It never imports vLLM into the course's process; ``batchlab.loadgen`` measures it from outside,
exactly as it measures batchlab's own server (``batchlab.serve``).
"""

from batchlab.vllm_ref.bench import VllmBench, vllm_bench_serve
from batchlab.vllm_ref.flags import FLAG_TABLE, VLLMFlags
from batchlab.vllm_ref.server import (SERVED_MODEL_NAME, SETUP_HINT, VLLMUnavailable, ensure_running, start_vllm,
                                      vllm_python, vllm_status)

__all__ = ["FLAG_TABLE", "SERVED_MODEL_NAME", "SETUP_HINT", "VLLMFlags", "VLLMUnavailable", "VllmBench", "ensure_running",
           "start_vllm", "vllm_bench_serve", "vllm_python", "vllm_status"]
