"""Before you rent the GPUs: predict a vLLM deployment's latencies and throughput end to end.

    python -m batchlab.predict --model Llama-3-8B --gpu H100 --request-rate 10 --input-len 600 --output-len 250

The pieces, in the order a prediction uses them:

- ``engine_flags``  vLLM's flags by vLLM's names, with vLLM V1's defaults for the device; the
                    batch sizes its CUDA graphs cover
- ``memory``        the KV cache vLLM allots each GPU, in blocks (and the errors when nothing fits)
- ``step_model``    one engine step: measured kernels split over the tensor-parallel GPUs, their
                    all-reduces (``backends.collectives``), CUDA-graph padding, the CPU's work
                    per step and how async scheduling hides it
- ``traffic``       generated traffic (``vllm bench serve``'s random dataset) or a logged trace
- ``deployment``    the whole setup, checked, and ``predict``: the simulator serves the traffic
                    on one replica or many behind a router (``batchlab.cluster``);
                    ``predict_disaggregated``: prefill and decode on separate pools
- ``report``        percentiles, throughput, KV use, preemptions, the saturation verdict, and
                    ``vllm bench serve``'s result keys
- ``__main__``      the command line

``vllm_v1.json`` holds every constant of the engine around the kernels, each with its source.
"""

from batchlab.predict.deployment import Deployment, predict, predict_disaggregated
from batchlab.predict.engine_flags import EngineFlags
from batchlab.predict.report import Prediction
from batchlab.predict.traffic import Traffic, TrafficSpec, read_trace

__all__ = ["Deployment", "EngineFlags", "Prediction", "Traffic", "TrafficSpec", "predict", "predict_disaggregated",
           "read_trace"]
