"""vLLM V1 on GPUs, simulated: what one ``vllm serve`` replica is, from its flags to its step time.

- ``memory``            the KV cache vLLM allots each GPU, in blocks (and errors when nothing fits)
- ``step_model``        one engine step: measured kernels over the TP group, CUDA-graph padding, the
                        CPU's work per step and how async scheduling hides it
- ``async_scheduling``  the scheduler rule async scheduling adds (a newcomer waits one step more)
- ``replica``           ``VllmReplica``: the above put together, checked as vLLM checks it

Its flags are ``batchlab.engine_args.EngineArgs``, resolved to V1's defaults for the GPU;
``vllm_v1.json`` (``vllm_data``) holds every constant of the engine around the kernels, each with
its source.
"""

from batchlab.vllm_sim.replica import VllmReplica
from batchlab.vllm_sim.step_model import VllmStepModel

__all__ = ["VllmReplica", "VllmStepModel"]
