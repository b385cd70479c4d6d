"""The speculative loop: prefill, draft, verify, accept, commit, roll back, stop.

State lives in a `Session` (caches, committed tokens, context features not yet given to the
drafter), so a chat can continue a conversation without re-prefilling its history.
Invariants between rounds: the target cache holds tokens[:-1] (the last committed token, the
anchor, is not yet fed); the drafter cache holds positions < drafter offset, and `pending`
holds the target features of the positions from there up to the anchor.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import mlx.core as mx

from ..drafter.model import Drafter
from ..errors import ParameterError
from ..target.adapter import TargetAdapter
from .events import RoundEvent
from .lookup import ContextLookup, PredictionLookup
from .sampling import SamplingParams, filtered_probs, pick, rejection_sample, sample


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int = 256
    sampling: SamplingParams = SamplingParams()
    block_size: int | None = None  # None = the drafter's trained block size
    speculative: bool = True  # False = plain decoding with the same sampler
    stop_token_ids: frozenset[int] = frozenset()
    # A guess of the answer's tokens (OpenAI's Predicted Outputs): drafted from where the
    # answer follows it; never changes the output.
    prediction: tuple[int, ...] = ()

    def __post_init__(self):
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                   for t in self.prediction):
            raise ParameterError("prediction must be a sequence of token ids (ints >= 0)")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise ParameterError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if self.block_size is not None and (
            not isinstance(self.block_size, int) or self.block_size < 1
        ):
            raise ParameterError(f"block_size must be an int >= 1, got {self.block_size!r}")


@dataclass
class Session:
    """Conversation state reusable across generations with the same engine."""

    target_cache: list
    drafter_cache: list
    tokens: list[int] = field(default_factory=list)  # committed ids, prompt included
    pending: mx.array | None = None  # features for positions drafter_offset .. len(tokens)-2
    in_round: bool = False  # a round was interrupted midway: the caches are not consistent
    lookup: ContextLookup | None = None  # n-gram index of `tokens` (context lookup drafts)
    prediction: PredictionLookup | None = None  # the current generation's predicted answer

    @property
    def fed(self) -> int:
        """Tokens held by the target cache."""
        return max(len(self.tokens) - 1, 0)


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


class SpeculativeDecoder:
    """`lookup`: propose the continuation of an earlier occurrence of the last `lookup`
    committed tokens when there is one, else the drafter's block (engine/lookup.py); 0: the
    drafter always."""

    def __init__(self, target: TargetAdapter, drafter: Drafter, prefill_chunk: int = 512,
                 lookup: int = 0):
        if not isinstance(lookup, int) or isinstance(lookup, bool) or lookup < 0:
            raise ParameterError(f"lookup must be an int >= 0 (0: off), got {lookup!r}")
        self.target = target
        self.drafter = drafter
        self.prefill_chunk = prefill_chunk
        self.lookup = lookup
        self.mask_id = drafter.config.mask_token_id
        drafter.bind(target.binding())

    def new_session(self) -> Session:
        return Session(self.target.make_cache(), self.drafter.make_cache(),
                       lookup=ContextLookup(self.lookup) if self.lookup else None)

    # --------------------------------------------------------------- prefill
    def _clear(self, session: Session) -> None:
        fresh = self.new_session()
        session.target_cache, session.drafter_cache = fresh.target_cache, fresh.drafter_cache
        session.pending, session.tokens, session.in_round = None, [], False

    def _reuse(self, session: Session, prompt: list[int]) -> int:
        """Roll the session back to its longest prefix shared with `prompt`; return its length."""
        fed = session.fed
        common = 0
        limit = min(fed, len(prompt) - 1)  # at least one prompt token must be fed anew
        while common < limit and session.tokens[common] == prompt[common]:
            common += 1
        if common == 0 or (common < fed and not all(c.is_trimmable() for c in session.target_cache)):
            self._clear(session)
            return 0
        if common < fed:
            for c in session.target_cache:
                c.trim(fed - common)
        d_off = self.drafter_offset(session)
        if d_off > common:
            for c in session.drafter_cache:
                c.trim(d_off - common)
            session.pending = None
        elif session.pending is not None:
            session.pending = session.pending[:, : common - d_off]
        session.tokens = session.tokens[:common]
        return common

    def drafter_offset(self, session: Session) -> int:
        return session.drafter_cache[0].offset if session.drafter_cache else 0

    def _prefill(self, session: Session, prompt: list[int], params: GenerationParams, key):
        t0 = time.perf_counter()
        if session.in_round:  # interrupted mid-round last time: start clean
            self._clear(session)
        reused = self._reuse(session, prompt) if session.tokens else 0
        new = mx.array(prompt[reused:])[None]
        keep = self.drafter.config.context_rows_needed
        logits, feats, first = self.target.prefill(new, session.target_cache, self.prefill_chunk, keep)
        first += reused
        d_off = self.drafter_offset(session)
        pending = session.pending
        if pending is not None and pending.shape[1] and first == d_off + pending.shape[1]:
            feats = mx.concatenate([pending, feats], axis=1)
        elif first > d_off:  # rows no drafter layer can see: skip them
            for c in session.drafter_cache:
                c.offset = first
        session.pending = feats
        token = int(pick(logits[0, -1], params.sampling, key).item())
        session.tokens = list(prompt) + [token]
        if session.lookup is not None:
            session.lookup.reset(session.tokens)
        return token, reused, _ms(t0)

    # --------------------------------------------------------------- rounds
    def _propose(self, session: Session, anchor: int, length: int, sp: SamplingParams, key):
        """(drafts [length - 1], q, candidates, source): the prediction's continuation while
        the answer follows it, else the context's own, else the prediction's after a re-sync
        (each a point mass: q = 1 on the one candidate), else the drafter's block.
        source: "prediction", "lookup" or "drafter"."""
        pred, look, n = session.prediction, session.lookup, length - 1
        found, source = [], "drafter"
        if pred is not None:
            found, source = pred.propose(n, resync=False), "prediction"
        if not found and look is not None:
            found, source = look.propose(n), "lookup"
        if not found and pred is not None:
            found, source = pred.propose(n), "prediction"
        if found:
            ids = mx.array(found)
            return ids, mx.ones((len(found), 1)), ids[:, None], source
        return (*self._draft(session, anchor, length, sp, key), "drafter")

    def _draft(self, session: Session, anchor: int, length: int, sp: SamplingParams, key):
        block = mx.array([[anchor] + [self.mask_id] * (length - 1)])
        hidden = self.drafter.hidden(block, session.pending, session.drafter_cache)[0, 1:]
        session.pending = None
        logits = self.drafter.draft_logits(hidden)  # over the draft vocabulary when it has one
        vocab = self.drafter.draft_vocab
        if self.drafter.config.version == 2:
            out = self.drafter.select(hidden, logits, mx.array(anchor), sp.temperature, key, vocab)
            return out.tokens, out.q, out.candidates
        if sp.greedy:
            ids = mx.argmax(logits, axis=-1)
            return (ids if vocab is None else vocab[ids]), None, None
        q = filtered_probs(logits, sp)
        ids = sample(q, key)
        if vocab is None:
            return ids, q, None
        return vocab[ids], q, mx.broadcast_to(vocab, q.shape)  # q is sparse over the vocab

    def _verify(self, session: Session, anchor: int, drafts: list[int], q, cand, sp, key):
        ids = mx.array([[anchor] + drafts])
        fwd = self.target.forward(ids, session.target_cache)
        logits = fwd.logits[0]
        if sp.greedy:
            target_ids = mx.argmax(logits, axis=-1).tolist()
            accepted = 0
            while accepted < len(drafts) and drafts[accepted] == target_ids[accepted]:
                accepted += 1
            bonus = target_ids[accepted]
        elif drafts:
            accepted, bonus = rejection_sample(
                mx.array(drafts), filtered_probs(logits, sp), q, cand, key
            )
        else:
            accepted, bonus = 0, int(pick(logits[-1], sp, key).item())
        return fwd, accepted, bonus

    def stream(
        self, prompt: Sequence[int], params: GenerationParams, session: Session | None = None
    ) -> Iterator[RoundEvent]:
        """Generate from `prompt` ids; yields one RoundEvent per round (the first: prefill)."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ParameterError("the prompt is empty: at least one token is needed")
        trained = self.drafter.config.block_size
        block = params.block_size or trained
        if block > trained:
            raise ParameterError(
                f"block_size {block} exceeds the drafter's trained block size {trained}"
            )
        if not params.speculative:
            block = 1
        vocab = self.target.vocab_size
        if any(t >= vocab for t in params.prediction):
            raise ParameterError(f"prediction holds token ids outside the vocabulary [0, {vocab})")
        sp = params.sampling
        seed = sp.seed if sp.seed is not None else int.from_bytes(os.urandom(4), "little")
        key = mx.random.key(seed)
        session = session if session is not None else self.new_session()
        stops = params.stop_token_ids

        key, sub = mx.random.split(key)
        token, reused, prefill_ms = self._prefill(session, prompt, params, sub)
        session.prediction = PredictionLookup(params.prediction) if params.prediction else None
        if session.prediction is not None:
            session.prediction.extend([token])
        produced = 1
        done = token in stops or produced >= params.max_tokens
        finish = ("stop" if token in stops else "length") if done else None
        yield RoundEvent([token], 0, 0, 1, 0.0, prefill_ms, finish, prefill=True,
                         prompt_tokens=len(prompt) - reused, reused_tokens=reused)
        while not done:
            length = min(block, params.max_tokens - produced)
            anchor = session.tokens[-1]
            key, k_draft, k_verify = mx.random.split(key, 3)
            session.in_round = True
            t0 = time.perf_counter()
            drafts, q, cand, source = [], None, None, "drafter"
            if length > 1:
                d, q, cand, source = self._propose(session, anchor, length, sp, k_draft)
                drafts = d.tolist()
            draft_ms = _ms(t0)
            t1 = time.perf_counter()
            fwd, accepted, bonus = self._verify(session, anchor, drafts, q, cand, sp, k_verify)
            commit = drafts[:accepted] + [bonus]
            commit = commit[: params.max_tokens - produced]
            hit = next((i for i, t in enumerate(commit) if t in stops), None)
            if hit is not None:
                commit = commit[: hit + 1]
            # Keep the anchor and the committed tokens except the last (the new anchor).
            keep = len(commit)
            self.target.rollback(session.target_cache, fwd, keep, len(drafts) + 1)
            pending = fwd.features[:, :keep]
            session.pending = pending if session.pending is None else mx.concatenate(
                [session.pending, pending], axis=1)
            mx.eval(session.pending, [c.state for c in session.target_cache])
            verify_ms = _ms(t1)
            session.tokens.extend(commit)
            for index in (session.lookup, session.prediction):
                if index is not None:
                    index.extend(commit)
            session.in_round = False
            produced += len(commit)
            finish = "stop" if hit is not None else ("length" if produced >= params.max_tokens else None)
            done = finish is not None
            yield RoundEvent(commit, len(drafts), min(accepted, len(commit)), len(drafts) + 1,
                             draft_ms, verify_ms, finish, lookup=source == "lookup",
                             predicted=source == "prediction")

    def generate(self, prompt: Sequence[int], params: GenerationParams,
                 session: Session | None = None) -> list[int]:
        return [t for ev in self.stream(prompt, params, session) for t in ev.tokens]
