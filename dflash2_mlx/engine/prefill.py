"""A prompt's prefill that advances a chunk at a time, then picks the first token.

The single-sequence engine feeds it straight through; the batched engine (engine/batch.py)
feeds a joining request's prompt a chunk per step while the others' rounds run, so a long
prompt does not stall their streams. Either way the chunks are the target's chunked prefill
(target/adapter.py `ChunkedPrefill`) over the session's own caches, and the first token, the
drafter's offset and the queued features come out as from a prefill in one go.
"""

from __future__ import annotations

import time
from typing import Callable

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache

from ..target.adapter import ChunkedPrefill, TargetAdapter
from ..target.capture import snapshot_state
from ..sampling import SamplingParams, pick
from .logprobs import token_logprobs
from .session import drafter_offset


def default_prefill_chunk() -> int:
    """Prompt tokens a prefill chunk: 256 on the CPU, where MLX's attention is composed of
    plain ops and chunks of 256 ran 6-10 % faster than of 512 (600 / 1,024 / 3,072-token
    prompts, SmolLM2, an Intel Xeon) and a cancel between chunks comes twice as soon; 512
    on a GPU."""
    return 256 if mx.default_device() == mx.cpu else 512


class _Cancelled(Exception):
    """Raised between prefill chunks when the caller's `cancel` says so."""


def _restorable(cache) -> bool:
    """A cache that cannot trim but whose whole state a snapshot restores (mlx-lm's
    ArraysCache: Gated-DeltaNet, Mamba), as target/rollback.py does after a verify."""
    return not cache.is_trimmable() and isinstance(cache, ArraysCache)


class Prefill:
    """The prefill of `prompt` into `session` (an engine/session.py Session whose first `reused`
    prompt tokens are already cached): `advance` feeds the next chunk; once `done`, `finish`
    picks the first token. Before every chunk but the first `cancel()` is polled: True raises
    _Cancelled, the session stopped between chunks (`roll_back`: the chunks it fed kept where
    every cache trims, else given back)."""

    def __init__(
        self,
        target: TargetAdapter,
        session,
        prompt: list[int],
        reused: int,
        keep_rows: int | None,
        cancel: Callable[[], bool] | None = None,
        score: int | None = None,
    ):
        self.started = time.perf_counter()
        self.session, self.prompt, self.reused, self.cancel = session, prompt, reused, cancel
        session.in_round = True  # until finish: a dropped prefill leaves the caches half-filled
        ids = mx.array(prompt[reused:])[None]
        # score (with reused 0): each prompt token's log-probability and `score` alternatives
        self.scores: list | None = None if score is None else []
        rows = None if score is None else (lambda logits, at: self._score(logits, at, score))
        self.feed = ChunkedPrefill(target, ids, session.target_cache, keep_rows, rows)
        self.ms = 0.0  # from the start to the first token, once finished
        self.logits: mx.array | None = None  # the first token's shaped logits [1, V], once finished
        self.rolled_back = False  # roll_back undid the chunks
        # False while a chunk is being fed or once finish begins: a failure there may leave
        # the caches changed in ways a trim does not undo
        self.between_chunks = True
        # what roll_back restores: each cache that cannot trim (a recurrent one), as it was
        self.saved = [(c, snapshot_state(c)) for c in session.target_cache if _restorable(c)]
        # ids fed (of this prefill's) when the session is shown to its on_checkpoint: all but
        # the last, and its branch points
        self.checkpoints: list[int] = []
        if session.on_checkpoint:
            ends = [p - reused for p in session.branch_points] + [self.feed.total - 1]
            self.checkpoints = sorted({n for n in ends if 0 < n < self.feed.total})

    @property
    def done(self) -> bool:
        return self.feed.done

    def _score(self, logits: mx.array, at: int, top: int) -> None:
        """A chunk's rows: row i predicts prompt token at + i + 1 (the last row of the prompt
        predicts the reply's first token, not scored here)."""
        following = self.prompt[self.reused + at + 1 : self.reused + at + logits.shape[1] + 1]
        self.scores.extend(token_logprobs(logits[0], following, top))

    @property
    def remaining(self) -> int:
        """Prompt tokens still to feed."""
        return self.feed.remaining

    def advance(self, chunk: int) -> int:
        """Feed the next `chunk` prompt tokens (fewer at the end); returns how many."""
        if self.feed.fed and self.cancel is not None and self.cancel():
            self.roll_back()
            raise _Cancelled
        self.between_chunks = False
        ahead = [n for n in self.checkpoints if n > self.feed.fed]
        if ahead:
            chunk = min(chunk, ahead[0] - self.feed.fed)
        n = self.feed.feed(chunk)
        self.between_chunks = True
        if self.feed.fed in self.checkpoints:
            self._checkpoint()
        return n

    def _checkpoint(self) -> None:
        """Show the session to its on_checkpoint as it stands (all the prompt but its last
        token fed, or up to a branch point): for that call its tokens and the drafter's
        features are those of a prefill that ended there, then back as they were."""
        session = self.session
        offsets = [c.offset for c in session.drafter_cache]
        saved = session.tokens, session.pending, session.in_round
        session.tokens = list(self.prompt[: self.reused + self.feed.fed + 1])
        _queue_features(session, *self._fed_features())
        session.in_round = False
        try:
            session.on_checkpoint(session)
        finally:
            session.tokens, session.pending, session.in_round = saved
            for c, offset in zip(session.drafter_cache, offsets):
                c.offset = offset

    def _fed_features(self) -> tuple[mx.array, int]:
        """The kept features of the ids fed so far, and the prompt position of the first."""
        features, first = self.feed.features()
        return features, self.reused + first

    def roll_back(self) -> bool:
        """Stop this prefill between chunks. Where every cache trims, the session keeps the
        chunks fed (an editor's next keystroke, or the prompt sent again, prefills only the
        rest; a prompt that branches off earlier trims them); else it holds its reused prefix
        again, recurrent caches restored to their state before it (a Ctrl-C or a client gone
        during a long prompt no longer costs the conversation's prefill). Neither where a
        chunk or the first token's pick was cut midway, or a cache can do neither. Returns
        whether the session is consistent (else it stays `in_round`: cleared on its next
        use)."""
        session, caches = self.session, self.session.target_cache
        if self.rolled_back:
            return True
        if not self.between_chunks:
            return False
        if self.feed.fed and all(c.is_trimmable() for c in caches):
            session.tokens = list(self.prompt[: self.reused + self.feed.fed + 1])
            _queue_features(session, *self._fed_features())
        else:
            restore = {id(c): state for c, state in self.saved}
            if self.reused < 1 or not all(c.is_trimmable() or id(c) in restore for c in caches):
                return False
            for c in caches:
                if id(c) in restore:
                    c.state = restore[id(c)]
                else:
                    c.trim(self.feed.fed)
            session.tokens = list(self.prompt[: self.reused + 1])
        session.in_round, self.rolled_back = False, True
        return True

    def run(self, chunk: int) -> Prefill:
        """Feed the rest in chunks of `chunk`."""
        while not self.done:
            self.advance(chunk)
        return self

    def finish(
        self,
        sampling: SamplingParams,
        key: mx.array,
        shape: Callable[[mx.array], mx.array] | None = None,
    ) -> int:
        """The first token, drawn with `key` from the last position's logits [1, V] as `shape`
        returns them (the generation's processors and constraint; None: as they are); the
        session then holds the prompt and it, and queues the features the drafter has not
        seen (rows no drafter layer can see skipped)."""
        session = self.session
        self.between_chunks = False
        logits, feats, first = self.feed.result()
        _queue_features(session, feats, self.reused + first)
        last = logits[0, -1:] if shape is None else shape(logits[0, -1:])
        self.logits = last  # [1, V]: the first token's distribution (its logprob)
        token = int(pick(last[0], sampling, key).item())
        session.tokens = list(self.prompt) + [token]
        session.in_round = False  # last: a shape or pick that raised leaves it to be cleared
        if session.lookup is not None:
            session.lookup.reset(session.tokens)
        self.ms = (time.perf_counter() - self.started) * 1000.0
        return token


def _queue_features(session, feats: mx.array, first: int) -> None:
    """Queue the prefill's features [1, n, F] of positions first.. for the drafter: after
    those it has not seen yet, or (rows no drafter layer can see skipped) in their place."""
    d_off = drafter_offset(session)
    pending = session.pending
    if pending is not None and pending.shape[1] and first == d_off + pending.shape[1]:
        feats = mx.concatenate([pending, feats], axis=1)
    elif first > d_off:
        for c in session.drafter_cache:
            c.offset = first
    session.pending = feats
