r"""Before you rent the GPUs: predict a vLLM deployment's latencies and throughput end to end.

    python -m batchlab.predict --model Llama-3-8B --gpu H100 --request-rate 10 \
        --input-len 600 --output-len 250

The pieces, in the order a prediction uses them:

- ``batchlab.vllm_sim``  (below this package) one replica as vLLM builds it: its flags
                    (``EngineArgs``) and defaults, KV memory, step time on measured kernels,
                    scheduler
- ``traffic``       generated traffic (``vllm bench serve``'s random dataset) or a logged trace
- ``deployment``    the whole setup, checked, and ``predict``: the simulator serves the traffic
                    on one replica or many behind a router (``batchlab.cluster``);
                    ``predict_disaggregated``: prefill and decode on separate pools
- ``report``        percentiles, throughput, KV use, preemptions, the saturation verdict, and
                    ``vllm bench serve``'s result keys
- ``__main__``      the command line

- ``planning``      capacity by bisection, and whether a run meets an SLO
- ``recommend``     the cheapest deployments that meet an SLO
"""

from batchlab.predict.deployment import Deployment, predict, predict_disaggregated
from batchlab.predict.report import Prediction
from batchlab.predict.traffic import Traffic, TrafficSpec, read_trace
from batchlab.engine_args import EngineArgs

__all__ = ["Deployment", "EngineArgs", "Prediction", "Traffic", "TrafficSpec", "predict",
           "predict_disaggregated", "read_trace"]
