"""The speculative loop: prefill, draft, verify, accept, commit, roll back, stop.

State lives in a `Session` (engine/session.py), so a chat can continue a conversation without
re-prefilling its history.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator, Sequence

import mlx.core as mx

from ..drafter.model import Drafter
from ..errors import CompatibilityError, ParameterError
from ..target.adapter import TargetAdapter
from .constraint import CONSTRAINT_METHODS
from .datastore import DEFAULT_DATASTORE_LENGTH, Datastore
from .events import RoundEvent
from .generation import GenerationParams, _Run, cut, shape_logits, token_ids
from .lookup import DEFAULT_LOOKUP_BLOCK, ContextLookup, PredictionLookup
from .prefill import Prefill, _Cancelled, default_prefill_chunk
from .proposal import NOTHING, Proposal
from ..sampling import SamplingParams
from .acceptance import accept
from .session import Session, drafter_offset, prediction_used, record
from ..values import is_int


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def check_lookup(lookup) -> None:
    if not is_int(lookup, 0):
        raise ParameterError(f"lookup must be an int >= 0 (0: off), got {lookup!r}")


class SpeculativeDecoder:
    """`lookup`: propose the continuation of an earlier occurrence of the last `lookup`
    committed tokens when there is one (up to GenerationParams.lookup_block tokens verified),
    else the drafter's block (engine/lookup.py); 0: the drafter always. `datastore`: when
    neither lookup nor the prediction proposes, the most frequent continuation of the context
    in an index of the target's own past answers (engine/datastore.py); None: off.
    `prefill_chunk`: prompt tokens a prefill chunk (None: prefill.default_prefill_chunk)."""

    def __init__(
        self,
        target: TargetAdapter,
        drafter: Drafter,
        prefill_chunk: int | None = None,
        lookup: int = 0,
        datastore: Datastore | None = None,
    ):
        check_lookup(lookup)
        prefill_chunk = default_prefill_chunk() if prefill_chunk is None else prefill_chunk
        if not isinstance(target, TargetAdapter):  # a bare mlx-lm model: Pair.from_models
            raise ParameterError(
                f"target must be a TargetAdapter (TargetAdapter(model, "
                f"drafter.config.target_layer_ids)), got {type(target).__name__}; "
                "Pair.from_models(model, tokenizer, drafter) builds both"
            )
        if not isinstance(drafter, Drafter):
            raise ParameterError(f"drafter must be a Drafter, got {type(drafter).__name__}")
        if (
            isinstance(prefill_chunk, bool)
            or not isinstance(prefill_chunk, int)
            or prefill_chunk < 1
        ):
            raise ParameterError(f"prefill_chunk must be an int >= 1, got {prefill_chunk!r}")
        if datastore is not None and not isinstance(datastore, Datastore):
            raise ParameterError(f"datastore must be a Datastore or None, got {datastore!r}")
        if datastore is not None and datastore.max_token() >= target.vocab_size:
            raise CompatibilityError(
                f"the datastore holds token id {datastore.max_token()}, outside this target's "
                f"vocabulary [0, {target.vocab_size}): it was built for another tokenizer "
                "(leave it out: --no-datastore, load_pair(datastore=False))"
            )
        self.target = target
        self.drafter = drafter
        self.prefill_chunk = prefill_chunk
        self.lookup = lookup
        self.datastore = datastore
        self.binding = target.binding()
        drafter.bind(self.binding)

    def bound_drafter(self) -> Drafter:
        """The drafter, bound to this decoder's target (one drafter object may serve two pairs:
        it drafts from the embedding and head of the pair that calls)."""
        if not self.drafter.is_bound(self.binding):
            self.drafter.bind(self.binding)
        return self.drafter

    def new_session(self) -> Session:
        return Session(
            self.target.make_cache(),
            self.drafter.make_cache(),
            lookup=ContextLookup(self.lookup) if self.lookup else None,
            owner=self,
        )

    def check_session(self, session: Session | None, cancel=None) -> None:
        """A session this decoder made (its caches fit these models) or None, and a callable
        `cancel` or None; anything else is a ParameterError."""
        if cancel is not None and not callable(cancel):
            raise ParameterError(f"cancel must be a callable or None, got {cancel!r}")
        if session is None:
            return
        if not isinstance(session, Session):
            raise ParameterError(
                f"session must be a Session (pair.new_session()), got {type(session).__name__}"
            )
        if session.owner is not self:
            raise ParameterError(
                "this session belongs to another pair (its caches fit that pair's models); "
                "make one with this pair's new_session()"
            )
        if session.busy:
            raise ParameterError(
                "this session is in use by another generation that has not finished; a session "
                "serves one generation at a time (make another with new_session())"
            )

    # --------------------------------------------------------------- prefill
    def _clear(self, session: Session) -> None:
        fresh = self.new_session()
        session.target_cache, session.drafter_cache = fresh.target_cache, fresh.drafter_cache
        session.pending, session.tokens, session.in_round = None, [], False

    def _reuse(self, session: Session, prompt: list[int]) -> int:
        """Roll the session back to its longest prefix shared with `prompt`; return its length."""
        fed, common = session.fed, session.reusable(prompt)
        if common == 0:
            self._clear(session)
            return 0
        if common < fed:
            for c in session.target_cache:
                c.trim(fed - common)
        d_off = self.drafter_offset(session)
        if d_off > common:
            for c in session.drafter_cache:
                c.trim(d_off - common)
            # evaluated here: a lazy trim is bound to this thread's stream, and the next step
            # of the generation may run on another thread (an async app's executor)
            mx.eval([c.state for c in session.drafter_cache])
            session.pending = None
        elif session.pending is not None:
            session.pending = session.pending[:, : common - d_off]
        session.tokens = session.tokens[:common]
        return common

    def drafter_offset(self, session: Session) -> int:
        return drafter_offset(session)

    def _begin(
        self,
        session: Session,
        prompt: list[int],
        cancel: Callable[[], bool] | None = None,
        score: int | None = None,
    ) -> Prefill:
        """Start the prefill of `prompt` into `session` (reusing the prefix it holds; caches
        an interrupted round left are cleared); feed it with `advance`, then `_first`.
        `score`: GenerationParams.prompt_logprobs (the whole prompt is then fed)."""
        if session.in_round or (score is not None and session.tokens):
            self._clear(session)
        reused = self._reuse(session, prompt) if session.tokens else 0
        keep = self.drafter.config.context_rows_needed
        return Prefill(self.target, session, prompt, reused, keep, cancel, score)

    # --------------------------------------------------------------- rounds
    def _propose(self, session: Session, anchor: int, run: _Run, key) -> Proposal:
        """What the constraint forces next, else the prediction's continuation while the answer
        follows it, else the context's own, else the prediction's after a re-sync: up to
        lookup_block - 1 tokens (no draft pass to pay for them); else the datastore's (up to
        DEFAULT_DATASTORE_LENGTH), at long contexts cut as its source's acceptance pays for
        (_Run.cut_model_free); else the drafter's block - 1 (none while its drafts do not pay:
        _Run.drafter_span). A greedy round's are cut to what it may commit (_Run.span)."""
        found = self._model_free(session, run)
        if found is not None:
            found = run.cut_model_free(found, len(session.tokens))
        if found is not None and found.drafts:  # cut to nothing: the drafter's round instead
            return found
        length = run.drafter_span(len(session.tokens))
        if length < 2:
            return NOTHING
        return self._draft(session, anchor, length, run.params.sampling, key)

    def _model_free(self, session: Session, run: _Run) -> Proposal | None:
        """What the constraint forces, else the prediction's, the context's or the datastore's
        proposal (see _propose); None: none found."""
        pred, look = session.prediction, session.lookup
        n = run.span(run.lookup_block) - 1  # propose(n < 1) finds nothing
        found, source = [], "drafter"
        if run.constraint is not None and n > 0:  # what the grammar forces: the surest drafts
            found, source = run.constraint.forced()[:n], "grammar"
        if not found and pred is not None:
            found, source = pred.propose(n, resync=False), "prediction"
        if not found and look is not None:
            found, source = look.propose(n), "lookup"
        if not found and pred is not None:
            found, source = pred.propose(n), "prediction"
        if not found and self.datastore is not None:
            found = self.datastore.propose(session.tokens, min(n, DEFAULT_DATASTORE_LENGTH))
            source = "datastore"
        return Proposal.point_mass(found, source) if found else None

    def _draft(
        self, session: Session, anchor: int, length: int, sp: SamplingParams, key
    ) -> Proposal:
        """The drafter's block (length - 1 drafts) over the features it has not seen yet."""
        block = self.bound_drafter().draft_block(
            anchor, length, session.pending, session.drafter_cache, sp, key
        )
        session.pending = None
        return Proposal.from_drafter(block)

    def _verify(self, session: Session, anchor: int, proposal: Proposal, run: _Run, key):
        # Built before the drafts are read: the drafter's pass runs meanwhile.
        fwd = self.target.forward(proposal.verify_ids(anchor), session.target_cache)
        logits = shape_logits(fwd.logits[0], run, session.tokens, proposal.drafts)
        accepted, bonus = accept(logits, proposal, run.params.sampling, key)
        return fwd, logits, accepted, bonus

    def _commit(self, session: Session, run: _Run, fwd, width: int, tokens: list[int]):
        """Commit the accepted `tokens` (cut at max tokens and after a stop token), roll the
        target cache back to them and queue their features for the drafter.
        Returns (the committed tokens, the finish reason or None)."""
        commit, finish = cut(run, tokens)
        # Keep the anchor and the committed tokens except the last (the new anchor).
        self.target.rollback(session.target_cache, fwd, len(commit), width)
        record(session, commit, fwd.features[:, : len(commit)])
        mx.eval(session.pending, [c.state for c in session.target_cache])
        return commit, finish

    def _round(self, session: Session, run: _Run) -> RoundEvent:
        """One round: propose, verify in one target forward, commit, roll back the rest."""
        anchor = session.tokens[-1]
        run.key, k_draft, k_verify = mx.random.split(run.key, 3)
        session.in_round = True
        t0 = time.perf_counter()
        proposal = self._propose(session, anchor, run, k_draft)
        draft_ms = _ms(t0)
        t1 = time.perf_counter()
        fwd, logits, accepted, bonus = self._verify(session, anchor, proposal, run, k_verify)
        drafted, room = len(proposal.drafts), run.room
        run.observe(proposal.source, drafted, accepted)
        commit, finish = self._commit(
            session, run, fwd, drafted + 1, proposal.drafts[:accepted] + [bonus]
        )
        logprobs = run.logprobs(logits, commit)
        verify_ms = _ms(t1)
        session.in_round = False
        return RoundEvent(
            tokens=commit,
            drafted=min(drafted, room),  # a sampled run's drafts past max_tokens never count
            # a cut round (max_tokens, a stop): its last kept token counts as the bonus
            accepted=min(accepted, len(commit) - 1),
            block_size=drafted + 1,
            draft_ms=draft_ms,
            verify_ms=verify_ms,
            finish_reason=finish,
            source=proposal.source,
            logprobs=logprobs,
            prediction_used=prediction_used(session),
        )

    # --------------------------------------------------------------- generation
    def _validate(self, prompt: Sequence[int], params: GenerationParams) -> tuple[list[int], _Run]:
        """The prompt as ints and the generation's limits, or a ParameterError."""
        vocab = self.target.vocab_size
        prompt = token_ids(prompt, "the prompt", vocab)
        if not prompt:
            raise ParameterError("the prompt is empty: at least one token is needed")
        trained = self.drafter.config.block_size
        block = params.block_size or trained
        for b, name in [(block, "block_size")] + [
            (b, "block_by_context") for _, b in params.block_by_context
        ]:
            if b > trained:  # the drafter's limit; lookup rounds have their own
                raise ParameterError(
                    f"{name}: block {b} exceeds the drafter's trained block size {trained}"
                )
        token_ids(params.prediction, "prediction", vocab)
        token_ids(params.stop_token_ids, "stop_token_ids", vocab)
        lookup_block = params.lookup_block or DEFAULT_LOOKUP_BLOCK
        if not params.speculative:
            block = lookup_block = 1
        sp = params.sampling
        # unseeded: a draw from MLX's global generator, so mx.random.seed() reproduces a run
        # as it does mlx-lm's (MLX seeds it from the clock); greedy draws nothing from it, as
        # mlx-lm's greedy does not (a caller's seeded draws after it stay theirs)
        seed = sp.seed
        if seed is None:
            seed = 0 if sp.greedy else int(mx.random.randint(0, 2**31 - 1).item())
        constraint = None
        if params.constraint is not None:
            ends = getattr(params.constraint, "stop_ids", frozenset())
            if not ends <= params.stop_token_ids:
                raise ParameterError(
                    f"the constraint ends its text with stop token ids {sorted(ends)}: "
                    "stop_token_ids must include them"
                )
            constraint = params.constraint()
            if not all(callable(getattr(constraint, m, None)) for m in CONSTRAINT_METHODS):
                raise ParameterError(
                    f"constraint: the factory returned {type(constraint).__name__}, not a "
                    f"TokenConstraint (methods {', '.join(CONSTRAINT_METHODS)})"
                )
        return prompt, _Run(params, block, lookup_block, mx.random.key(seed), constraint)

    def _first(self, prefill: Prefill, run: _Run) -> RoundEvent:
        """The prompt is fed: pick the first token (the prefill event)."""
        params = run.params
        run.key, sub = mx.random.split(run.key)
        token = prefill.finish(params.sampling, sub, lambda x: shape_logits(x, run, prefill.prompt))
        session = prefill.session
        session.prediction = PredictionLookup(params.prediction) if params.prediction else None
        if session.prediction is not None:
            session.prediction.extend([token])
        commit, finish = cut(run, [token])
        return RoundEvent(
            tokens=[token],
            logprobs=run.logprobs(prefill.logits, commit),
            prefill_ms=prefill.ms,
            finish_reason=finish,
            prefill=True,
            prompt_tokens=len(prefill.prompt) - prefill.reused,
            reused_tokens=prefill.reused,
            prediction_tokens=len(params.prediction),
            prediction_used=prediction_used(session),
            prompt_logprobs=None if prefill.scores is None else tuple(prefill.scores),
        )

    def _start(
        self,
        session: Session,
        prompt: list[int],
        run: _Run,
        cancel: Callable[[], bool] | None = None,
    ) -> RoundEvent:
        """Prefill the prompt (reusing what the session holds) and pick the first token.
        Raises _Cancelled between prefill chunks when `cancel()` is true."""
        prefill = self._begin(session, prompt, cancel, run.params.prompt_logprobs)
        return self._first(prefill.run(self.prefill_chunk), run)

    def stream(
        self,
        prompt: Sequence[int],
        params: GenerationParams,
        session: Session | None = None,
        cancel: Callable[[], bool] | None = None,
    ) -> Iterator[RoundEvent]:
        """Generate from `prompt` ids; yields one RoundEvent per round (the first: prefill).
        `cancel`: polled before the prefill, between its chunks and between rounds; when it
        returns True the stream ends there, with no further event (a long prompt does not run
        on after its client left; the session keeps what it holds). Bad arguments raise
        here, before anything runs."""
        prompt, run = self._validate(prompt, params)
        self.check_session(session, cancel)
        session = session if session is not None else self.new_session()
        session.hold(run)  # now: a second stream on it is refused (dropped unstarted: freed)
        return self._events(prompt, run, session, cancel)

    def _events(
        self, prompt: list[int], run: _Run, session: Session, cancel
    ) -> Iterator[RoundEvent]:
        stop = cancel if cancel is not None else (lambda: False)
        try:
            if stop():
                return
            try:
                event = self._start(session, prompt, run, cancel)
            except _Cancelled:
                return
            yield event
            while event.finish_reason is None and not stop():
                event = self._round(session, run)
                yield event
        finally:
            session.release()

    def generate(
        self, prompt: Sequence[int], params: GenerationParams, session: Session | None = None
    ) -> list[int]:
        return [t for ev in self.stream(prompt, params, session) for t in ev.tokens]
