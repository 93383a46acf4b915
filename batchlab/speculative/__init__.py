"""Speculative decoding: who drafts the next tokens, and how many a step may verify.

- ``config.py``: ``SpeculativeConfig``, vLLM's ``--speculative-config`` by its names and
  defaults, with the batch-size schedule that shortens or turns off drafting in a large batch.
- ``ngram.py``: prompt lookup (vLLM's ``ngram`` method), a drafter that needs no weights.
  The other drafter, the model's own first layers (``method="early_exit"``), runs the model, so
  it lives with it: ``batchlab.model.early_exit``. A separate draft model (``draft_model``) is
  priced by the simulator only (``vllm_sim.VllmStepModel.draft_model``).
- ``acceptance.py``: how many drafted tokens a check accepts, as a distribution per request, for
  the simulator (fitted to measured runs).

The model checks the drafts (``batchlab.model.verify``); the scheduler fits them into a step's
budget (``schedulers/continuous.py``); the engine appends what was accepted and gives back the
KV room of what was not (``engine.py``).
"""

from batchlab.speculative.acceptance import AcceptanceModel, AcceptanceStream, expected_accepted
from batchlab.speculative.config import SpeculativeConfig, check_runs_on_the_model
from batchlab.speculative.ngram import propose_ngram

__all__ = ["AcceptanceModel", "AcceptanceStream", "SpeculativeConfig", "check_runs_on_the_model",
           "expected_accepted", "propose_ngram"]
