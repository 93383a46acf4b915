"""The simulator backend (``SimBackend``): a step takes the time a cost model predicts and
computes nothing; every sampled token is a placeholder.

Its KV cache is accounting only (``TokenKVSpace``, or a paged ``BlockManager`` with
``block_size``); ``noise`` multiplies each step by a seeded lognormal factor of mean 1. The
rules and their reasons (speculative decoding, noise): ``docs/the-core.md``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from batchlab.backends.base import Backend, StepResult
from batchlab.steptime.cost_model import CostModel, StepTimeModel
from batchlab.checks import check_instance, check_int, check_number
from batchlab.engine_args import EngineArgs
from batchlab.kv_blocks import BlockManager
from batchlab.kv_space import TokenKVSpace
from batchlab.plan import StepPlan, decode_split, step_features
from batchlab.requests import Request
from batchlab.speculative import AcceptanceModel, AcceptanceStream, SpeculativeConfig

PLACEHOLDER_TOKEN = -1
_NOISE_BLOCK = 4096  # noise factors drawn at a time (numpy is fast per block, slow per call)


class SimBackend(Backend):
    """Predicts step durations with ``cost_model``; see the module docstring for the rules."""

    def __init__(self, cost_model: CostModel, kv_capacity_tokens: int,
                 max_seq_len: int | None = None, noise: float = 0.0, seed: int = 0,
                 block_size: int | None = None, enable_prefix_caching: bool = False,
                 reserve_blocks: int = 0, placeholder_token: int = PLACEHOLDER_TOKEN,
                 speculative_config: SpeculativeConfig | None = None,
                 acceptance: AcceptanceModel | None = None) -> None:
        if not isinstance(cost_model, StepTimeModel):
            raise ValueError(f"cost_model={cost_model!r}; must be a CostModel "
                             "(CostModel.load(path) reads a saved fit) or a RooflineCostModel "
                             "(steptime.roofline)")
        check_number("noise", noise, hint="the lognormal sigma, 0 = no noise")
        check_int("seed", seed, minimum=-2**63)
        check_int("placeholder_token", placeholder_token, minimum=PLACEHOLDER_TOKEN)
        self.placeholder_token = placeholder_token
        self.cost_model = cost_model
        self.kv = _kv_space(kv_capacity_tokens, max_seq_len, block_size, enable_prefix_caching,
                            reserve_blocks)
        self.noise = float(noise)
        self.seed = seed
        check_instance("speculative_config", speculative_config, SpeculativeConfig,
                       "a SpeculativeConfig", allow_none=True,
                       hint="SpeculativeConfig.parse(text) reads vLLM's JSON")
        self.speculative = speculative_config
        if ((self.speculative is None) != (acceptance is None)
                or not isinstance(acceptance, (AcceptanceModel, type(None)))):
            raise ValueError(f"acceptance={acceptance!r}: a speculative config needs an "
                             "AcceptanceModel (how many drafted tokens a check accepts), and an "
                             "AcceptanceModel needs a speculative config")
        self._draft_pass = self._draft_pass_model(cost_model)
        if self.speculative is not None and hasattr(cost_model, "speculating"):
            # the engine as vLLM runs this drafter
            self.cost_model = cost_model.speculating(self.speculative)
        self.acceptance = acceptance
        self._streams: dict[str, AcceptanceStream] = {}
        self._noise_factors: list[float] = []
        self.reset()

    @classmethod
    def for_args(cls, cost_model: StepTimeModel, kv_capacity_tokens: int, args: EngineArgs, *,
                 paged: bool = True, noise: float = 0.0, seed: int = 0,
                 placeholder_token: int = PLACEHOLDER_TOKEN) -> "SimBackend":
        """The simulator under vLLM's flags ``args`` (their context length, blocks and prefix
        caching; a reserving, slot-like cache with ``paged=False``): the one builder of it from
        flags."""
        return cls(cost_model, kv_capacity_tokens, args.max_model_len, noise, seed,
                   args.block_size if paged else None, bool(args.enable_prefix_caching),
                   placeholder_token=placeholder_token)

    def _draft_pass_model(self, cost_model: StepTimeModel) -> StepTimeModel | None:
        """What one draft pass costs: the model cut short (``early_exit``), the drafter's own
        kernels (``draft_model``), or nothing (``ngram``: drafted on the host)."""
        method = None if self.speculative is None else self.speculative.method
        if method == "early_exit":
            if not hasattr(cost_model, "early_exit"):
                raise ValueError("method='early_exit' needs a cost model that knows the model's "
                                 "layers (a RooflineCostModel or a VllmStepModel), not "
                                 f"{type(cost_model).__name__}")
            return cost_model.early_exit(self.speculative.early_exit_layer)
        if method == "draft_model":
            if not hasattr(cost_model, "draft_model"):
                raise ValueError("method='draft_model' needs a cost model that prices another "
                                 "model's kernels on the same GPUs (a VllmStepModel), not "
                                 f"{type(cost_model).__name__}")
            return cost_model.draft_model(self.speculative.model)
        return None

    @property
    def cost_model(self) -> StepTimeModel:
        return self._cost_model

    @cost_model.setter
    def cost_model(self, cost_model: StepTimeModel) -> None:
        self._cost_model = cost_model
        # The additive model is written out in step_duration (read once per step); any other
        # form (the roofline) is asked through its predict_features.
        self._coefficients = cost_model.coefficients if isinstance(cost_model, CostModel) else None
        # only a model that prices decodes and prompt chunks apart is told which is which
        self._wants_split = type(cost_model).predict_split is not StepTimeModel.predict_split

    # --- the contract ------------------------------------------------------------------------
    def run(self, plan: StepPlan, requests: Mapping[str, Request]) -> StepResult:
        """Predict the step's duration; every sampling chunk "produces" the placeholder token."""
        chunks = plan.chunks
        new_tokens = dict.fromkeys([c.request_id for c in chunks if c.samples],
                                   self.placeholder_token)
        if not chunks:
            return StepResult(new_tokens, 0.0)
        split = decode_split(chunks) if self._wants_split else None
        result = StepResult(new_tokens, self.step_duration(*step_features(chunks), split=split))
        if self.speculative is not None:
            self._speculate(result, chunks, requests)
        return result

    def _speculate(self, result: StepResult, chunks, requests: Mapping[str, Request]) -> None:
        """Each checked draft accepts as its request's acceptance stream says (placeholder tokens);
        each sampling request drafts ``k`` placeholders for its next step when its stream drafts
        (``k`` from the config's batch-size schedule, within its remaining tokens)."""
        k, token = self.speculative.tokens_for_batch(len(chunks)), self.placeholder_token
        # (context after this step, tokens drafted) per drafting request
        drafting = []
        for c in chunks:
            if not c.samples:
                continue
            rid, req = c.request_id, requests[c.request_id]
            stream = (self._streams.get(rid)
                      or self._streams.setdefault(rid, self.acceptance.stream(rid)))
            emitted = 1
            if c.draft:
                del result.new_tokens[rid]
                emitted = 1 + stream.accepted(len(c.draft))
                result.verified[rid] = [token] * emitted
            room = min(k, req.max_new_tokens - len(req.output_ids) - emitted - 1)
            if room > 0 and stream.drafts():
                result.drafts[rid] = [token] * room
                drafting.append((req.prompt_len + len(req.output_ids) + emitted, room))
        if self._draft_pass is not None and k > 0:
            result.duration += self._draft_seconds(chunks, drafting)

    def _draft_seconds(self, chunks, drafting: list[tuple[int, int]]) -> float:
        """The draft passes of a step (no noise drawn). Pass ``j`` computes one token of each
        request drafting more than ``j``, attending to its context so far. An early exit reads
        the target's KV cache; a draft model keeps its own, so its first pass runs over all the
        step's tokens (prompt chunks and checked positions, as vLLM's drafter does: its cache
        stays current) and drafts the first token from them."""
        seconds, first = 0.0, 0
        if self.speculative.method == "draft_model":
            seconds, first = self._draft_pass.predict_features(*step_features(chunks)), 1
        for j in range(first, max((room for _, room in drafting), default=0)):
            contexts = [context + j for context, room in drafting if room > j]
            seconds += self._draft_pass.predict_features(len(contexts), len(contexts),
                                                         sum(contexts))
        return seconds

    def release(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    def reset(self) -> None:
        """Start the noise stream over from ``seed``. The engine calls this when a run starts, so
        every run on this backend draws the same noise whatever ran before it."""
        self._rng = np.random.default_rng(self.seed)
        self._streams = {}
        self._noise_factors = []
        self._noise_next = 0

    # --- used by run() and by the serving loop's fast path (batchlab.sim.fast_path) -------
    def step_duration(self, num_seqs: int, num_tokens: int, attention_pairs: int,
                      split: tuple[int, int] | None = None) -> float:
        """The duration of the next step with these features; consumes one noise draw. ``split``
        is ``(decode_seqs, decode_pairs)`` (``plan.decode_split``); None: every sequence decodes.

        The fast path (``batchlab.sim.fast_path``) calls this directly for steps it does not
        build a plan for; the result is exactly what ``run`` would return for the same step.
        """
        if self._coefficients is None:
            decode_seqs, decode_pairs = split or (num_seqs, attention_pairs)
            duration = self._cost_model.predict_split(num_seqs, num_tokens, attention_pairs,
                                                      decode_seqs, decode_pairs)
        else:
            # cost_model.predict_features, written out: this runs once per simulated step.
            fixed, per_seq, per_token, per_pair = self._coefficients
            duration = (fixed + per_seq * num_seqs + per_token * num_tokens
                        + per_pair * attention_pairs)
        if self.noise:
            i = self._noise_next
            if i == len(self._noise_factors):
                self._draw_noise_block()
                i = 0
            self._noise_next = i + 1
            duration *= self._noise_factors[i]
        return duration

    def _draw_noise_block(self) -> None:
        """The next block of noise factors, from the seeded stream (one factor per step)."""
        sigma = self.noise
        z = self._rng.standard_normal(_NOISE_BLOCK)
        self._noise_factors = np.exp(sigma * z - 0.5 * sigma * sigma).tolist()
        self._noise_next = 0

    def __repr__(self) -> str:
        seq = f", max_seq_len={self.kv.max_seq_len}" if self.kv.max_seq_len is not None else ""
        if isinstance(self.kv, BlockManager):
            seq += (f", block_size={self.kv.block_size}, enable_prefix_caching="
                    f"{self.kv.enable_prefix_caching}")
        return (f"SimBackend(kv_capacity_tokens={self.kv.capacity_tokens}{seq}, "
                f"noise={self.noise}, seed={self.seed}, cost_model={self.cost_model!r})")


def _kv_space(kv_capacity_tokens: int, max_seq_len: int | None, block_size: int | None,
              enable_prefix_caching: bool, reserve_blocks: int) -> TokenKVSpace | BlockManager:
    """The simulator's KV space: token slots, or paged blocks when ``block_size`` is given."""
    if block_size is None:
        if enable_prefix_caching or reserve_blocks:
            raise ValueError("enable_prefix_caching and reserve_blocks need a paged cache: "
                             "give block_size (e.g. 16)")
        return TokenKVSpace(kv_capacity_tokens, max_seq_len)  # validates both numbers
    TokenKVSpace(kv_capacity_tokens, max_seq_len)   # the same checks of both numbers
    return BlockManager.from_tokens(kv_capacity_tokens, block_size, max_seq_len,
                                    enable_prefix_caching, reserve_blocks)
