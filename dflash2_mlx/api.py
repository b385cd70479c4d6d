"""A target paired with a drafter (`Pair`), ready to generate: alone, in sessions, in batches
(`load_pair`, in loader.py, loads one)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Sequence

import mlx.core as mx

from .engine.datastore import Datastore
from .drafter.model import Drafter
from .engine.batch import DEFAULT_MAX_BATCH, BatchDecoder
from .engine.events import GenerationStats, RoundEvent
from .engine.lookup import DEFAULT_LOOKUP
from .engine.generation import GenerationParams
from .engine.logprobs import TokenLogprob
from .engine.scoring import PromptScoring
from .engine.loop import SpeculativeDecoder
from .engine.session import Session
from .engine.width import WidthRule
from .errors import CompatibilityError, ParameterError
from .grammar import Grammar, Grammars, Thinking
from .settings import Drafting
from .target.adapter import TargetAdapter

log = logging.getLogger(__name__)


def check_compatible(adapter: TargetAdapter, drafter: Drafter) -> None:
    """Raise CompatibilityError if the drafter cannot run on this target."""
    cfg = drafter.config
    if cfg.hidden_size != adapter.hidden_size:
        raise CompatibilityError(
            f"drafter hidden_size {cfg.hidden_size} != target hidden size {adapter.hidden_size}: "
            "a drafter shares the target's embedding and LM head, so they must match"
        )
    if cfg.vocab_size != adapter.vocab_size:
        raise CompatibilityError(
            f"drafter vocab_size {cfg.vocab_size} != target vocabulary {adapter.vocab_size}"
        )
    if not 0 <= cfg.mask_token_id < adapter.vocab_size:
        raise CompatibilityError(
            f"drafter mask_token_id {cfg.mask_token_id} is outside the target vocabulary"
        )
    made_for, layers = cfg.num_target_layers, len(adapter.layers)
    if made_for is not None and made_for != layers:  # it runs, exactly, but seldom drafts right
        log.warning(
            "the drafter was made for a target of %d layers; this one has %d: another model "
            "(its drafts will seldom be accepted)",
            made_for,
            layers,
        )


@dataclass
class Pair:
    """A target model, its tokenizer and a drafter, ready to generate."""

    model: Any
    tokenizer: Any
    drafter: Drafter
    decoder: SpeculativeDecoder
    _grammars: Grammars | None = field(default=None, repr=False)
    # How a generation that leaves block_size out drafts: load_pair resolves it as chat and
    # serve do (this machine's autotune profile, else the pair's recommended block); empty
    # (from_models): the drafter's trained block.
    drafting: Drafting = field(default_factory=Drafting)
    # cost(rows, width) of a batched verify from this machine's autotune profile (load_pair,
    # as serve's); None: engine/width.py's default model. `batch` uses it unless given one.
    width_cost: Callable[[int, int], float] | None = field(default=None, repr=False)

    @classmethod
    def from_models(
        cls,
        model,
        tokenizer,
        drafter: Drafter,
        prefill_chunk: int | None = None,
        lookup: int = DEFAULT_LOOKUP,
        datastore: Datastore | None = None,
    ) -> "Pair":
        """`lookup` > 0: context-lookup drafts where the context repeats (engine/lookup.py);
        0: the drafter alone. `datastore`: drafts from an index of the target's past answers
        (engine/datastore.py)."""
        if not isinstance(drafter, Drafter):  # a folder's name: load_pair, or load_drafter
            raise ParameterError(
                f"drafter must be a Drafter (load_drafter(folder)), got {type(drafter).__name__}"
            )
        adapter = TargetAdapter(model, drafter.config.target_layer_ids)
        check_compatible(adapter, drafter)
        pair = cls(
            model,
            tokenizer,
            drafter,
            SpeculativeDecoder(adapter, drafter, prefill_chunk, lookup=lookup, datastore=datastore),
        )
        bad = sorted(i for i in pair.eos_ids if not 0 <= i < adapter.vocab_size)
        if bad:  # every request would be refused for stop ids it never sent
            raise CompatibilityError(
                f"the tokenizer's end-of-sequence id {bad[0]} is outside the target's vocabulary "
                f"[0, {adapter.vocab_size}): check eos_token in tokenizer_config.json and "
                "eos_token_id in config.json and generation_config.json"
            )
        return pair

    @property
    def eos_ids(self) -> frozenset[int]:
        """mlx-lm's eos_token_ids (a set), else a tokenizer's eos_token_id(s) (an int or ids)."""
        ids = getattr(self.tokenizer, "eos_token_ids", None)
        if ids is None:
            ids = getattr(self.tokenizer, "eos_token_id", None)
        if ids is None:
            return frozenset()
        return frozenset([int(ids)] if isinstance(ids, int) else (int(i) for i in ids))

    @property
    def vocab_size(self) -> int:
        """Token ids the target scores (its logits' width): a prompt's ids must be below it."""
        return self.decoder.target.vocab_size

    def new_session(self) -> Session:
        return self.decoder.new_session()

    def json_schema(self, schema: dict | None = None, thinking: Thinking | None = None) -> Grammar:
        """A `GenerationParams.constraint`: the reply is a JSON value `schema` accepts (None:
        any JSON object), then a stop token; `thinking`: after a thinking section (see
        grammar.Thinking). Raises ParameterError for a schema it cannot compile."""
        if thinking is not None and not isinstance(thinking, Thinking):
            raise ParameterError(
                f"thinking must be a grammar.Thinking (the model's markers) or None, got {thinking!r}"
            )
        return self.grammars.json_schema(schema, thinking)

    @property
    def grammars(self) -> Grammars:
        """Grammars over this pair's tokens (grammar.py): replies held to a JSON schema and
        tool calls to their arguments' schemas."""
        if self._grammars is None:
            self._grammars = Grammars(self.tokenizer, self.vocab_size, self.eos_ids)
        return self._grammars

    def with_defaults(self, params: GenerationParams) -> GenerationParams:
        """`params` with the tokenizer's EOS ids added to its stop tokens (a reply ends at its
        end of turn, as OpenAI's `stop` adds to it; the engine's `decoder.stream` stops at
        exactly the ids it is given), drafting as `drafting` says where it leaves block_size
        out."""
        if not isinstance(params, GenerationParams):
            raise ParameterError(f"params must be a GenerationParams, got {type(params).__name__}")
        stops = params.stop_token_ids | self.eos_ids
        if stops != params.stop_token_ids:
            params = replace(params, stop_token_ids=stops)
        return self._drafted(params)

    def _drafted(self, params: GenerationParams) -> GenerationParams:
        """`params` that leave block_size out, drafting as `drafting` says: its block, and its
        schedule, verify cost and lookup block where `params` leave those out too (a schedule
        given applies from its contexts on, as given). Params with a block as they are."""
        if not isinstance(self.drafting, Drafting):
            raise ParameterError(
                f"pair.drafting must be a dflash2_mlx.settings.Drafting, got {self.drafting!r}"
            )
        if not params.speculative or params.block_size is not None or self.drafting.block is None:
            return params
        fields = self.drafting.fields(params.sampling.temperature, self.drafter.config.block_size)
        if params.block_by_context:  # the caller's schedule, with its own verify cost or none
            fields["block_by_context"], fields["verify_cost"] = (), None
        for name in ("block_by_context", "verify_cost", "lookup_block"):
            own = getattr(params, name)
            if own is not None and own != ():
                fields[name] = own
        return replace(params, **fields)

    def stream(
        self,
        prompt_ids,
        params: GenerationParams,
        session: Session | None = None,
        cancel: Callable[[], bool] | None = None,
    ) -> Iterator[RoundEvent]:
        """`cancel`: polled before the prefill, between its chunks and between rounds (True:
        the stream ends there, no further event)."""
        return self.decoder.stream(prompt_ids, self.with_defaults(params), session, cancel)

    def batch(
        self,
        max_batch: int = DEFAULT_MAX_BATCH,
        width_cost: Callable[[int, int], float] | None = None,
    ) -> BatchDecoder:
        """A continuous-batching loop over this pair (engine/batch.py): `add` requests at any
        time (their params get `with_defaults`), `step` it; each returns what it returns alone.
        `max_batch`: requests generating together, each with a KV cache as long as the longest
        running (lower it where memory is short). `width_cost`: cost(rows, width) of a batched
        verify (settings.EngineSettings.width_cost, from the autotune profile); None: the
        pair's `width_cost`."""
        width_cost = self.width_cost if width_cost is None else width_cost
        if width_cost is not None and not callable(width_cost):
            raise ParameterError(f"width_cost must be a callable or None, got {width_cost!r}")
        if width_cost is None:  # the default model's slope was measured on x86 CPUs only
            widths = WidthRule(cut_uniform=mx.default_device() == mx.cpu)
        else:
            widths = WidthRule(cost=width_cost)
        return BatchDecoder(self.decoder, max_batch, widths=widths, defaults=self.with_defaults)

    def stream_batch(
        self,
        prompts: Sequence,
        params: GenerationParams | Sequence[GenerationParams],
        max_batch: int = DEFAULT_MAX_BATCH,
        width_cost: Callable[[int, int], float] | None = None,
    ) -> Iterator[tuple[int, RoundEvent]]:
        """Generate from several prompts together; yields (prompt index, event). `params`: one
        for all, or one per prompt. `width_cost`: as for `batch`."""
        prompts = list(prompts)  # a generator too
        params = _params_per_prompt(params, len(prompts))
        return self.batch(max_batch, width_cost).stream(zip(prompts, params))

    def generate_batch(
        self,
        prompts: Sequence,
        params: GenerationParams | Sequence[GenerationParams],
        max_batch: int = DEFAULT_MAX_BATCH,
        width_cost: Callable[[int, int], float] | None = None,
    ) -> list[tuple[list[int], GenerationStats]]:
        prompts = list(prompts)  # a generator too
        params = _params_per_prompt(params, len(prompts))
        for p in params:
            _no_logprobs(p, "generate_batch")
        results = [([], GenerationStats()) for _ in prompts]
        for i, ev in self.stream_batch(prompts, params, max_batch, width_cost):
            results[i][0].extend(ev.tokens)
            results[i][1].add(ev)
        return results

    def prompt_logprobs(self, prompt_ids, top: int = 0) -> list[TokenLogprob]:
        """The log-probability of each prompt token after the first under the target, given
        the tokens before it (an evaluation's loglikelihood), with the `top` likeliest tokens
        at each position: engine/scoring.py."""
        return PromptScoring(self.decoder.target, prompt_ids, top).run()

    def generate(
        self, prompt_ids, params: GenerationParams, session: Session | None = None
    ) -> tuple[list[int], GenerationStats]:
        _no_logprobs(params, "generate")
        stats = GenerationStats()
        out: list[int] = []
        for ev in self.stream(prompt_ids, params, session):
            stats.add(ev)
            out.extend(ev.tokens)
        return out, stats


def _params_per_prompt(params, n: int) -> list[GenerationParams]:
    """One GenerationParams for all `n` prompts, or an iterable of one per prompt."""
    if isinstance(params, GenerationParams):
        return [params] * n
    if isinstance(params, (str, bytes, dict)) or not hasattr(params, "__iter__"):
        raise ParameterError(
            "params must be a GenerationParams or a list of them (one per prompt), got "
            f"{type(params).__name__}"
        )
    params = list(params)  # a generator too
    bad = next((i for i, p in enumerate(params) if not isinstance(p, GenerationParams)), None)
    if bad is not None:
        raise ParameterError(
            f"params[{bad}] must be a GenerationParams, got {type(params[bad]).__name__}"
        )
    if len(params) != n:
        raise ParameterError(f"{n} prompts but {len(params)} GenerationParams")
    return params


def _no_logprobs(params, method: str) -> None:
    """generate's results hold tokens and stats: log-probabilities would be dropped."""
    for name in ("logprobs", "prompt_logprobs"):
        if getattr(params, name, None) is not None:
            raise ParameterError(
                f"{name}: {method} returns no log-probabilities; read them off the events of "
                f"pair.stream / stream_batch (RoundEvent.{name}) or generate_text(...).{name}"
            )
