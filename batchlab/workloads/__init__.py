"""Workloads: who asks what, and when. One module per concern:

- ``arrivals``  when requests arrive (at once, fixed rate, Poisson, gamma bursts)
- ``lengths``   how long prompts and answers are (distributions, the course's presets)
- ``prompts``   real prompt text from the corpus that ships with the package
- ``make``      ``make_workload``: all three together, reproducible from one seed
- ``files``     workload files (JSON lines) saved and read back
- ``scripted``  requests at exact times and lengths, for staged scenes in the notebooks
- ``sessions``  multi-turn chat sessions over shared system prompts (prefix sharing as a knob)

A serving benchmark is only as meaningful as its workload; the notebooks build theirs here and
hand the requests to an engine.
"""

from batchlab.workloads.arrivals import (
    ARRIVALS, arrivals_at_once, arrivals_fixed, arrivals_gamma, arrivals_poisson, make_arrivals,
)
from batchlab.workloads.files import (
    WORKLOAD_FORMAT, load_workload, read_workload_header, save_workload,
)
from batchlab.workloads.lengths import (
    PRESETS, SCALES, Fixed, LengthPreset, Mixture, Range, get_preset,
)
from batchlab.workloads.make import make_workload, request_ids, scale_arrivals
from batchlab.workloads.prompts import CORPUS_PATH, CorpusPrompts, prompt_seed
from batchlab.workloads.sessions import (
    SessionShape, SessionWorkload, ideal_prefix_reuse, make_sessions,
)

__all__ = [
    "ARRIVALS", "arrivals_at_once", "arrivals_fixed", "arrivals_gamma", "arrivals_poisson",
    "make_arrivals", "WORKLOAD_FORMAT", "load_workload", "read_workload_header", "save_workload",
    "PRESETS", "SCALES", "Fixed", "LengthPreset", "Mixture", "Range", "get_preset",
    "make_workload", "request_ids", "scale_arrivals",
    "CORPUS_PATH", "CorpusPrompts", "prompt_seed",
    "SessionShape", "SessionWorkload", "ideal_prefix_reuse", "make_sessions",
]
