"""A prompt cache across requests: the engine state of recent conversations, reused by prefix.

An entry is a `Session` (target KV and recurrent state, drafter cache and pending features,
lookup index) keyed by the tokens its target cache holds. A request leases the entry that
serves the longest prefix of its prompt, and the engine prefills only the rest (it rolls the
session back to the common prefix, engine/loop.py). A leased entry is out of the cache, so it
serves one request at a time; it comes back, extended by that request, when the lease ends.

Attention caches trim, so an entry serves any prefix it shares with a prompt. Recurrent caches
(Gated-DeltaNet: mlx-lm's ArraysCache) cannot be rolled back, so such an entry serves only
prompts that extend all it holds; for those targets the state at each prompt's last token
(all of it fed but that one) is stored too: the same prompt sent again resumes there, and so
does a next turn, which re-renders the answer through the chat template and seldom matches the
state after the generation token for token. And the state is stored on the way where a
prompt branches off a stored prompt, or at a position the caller names (the server: where a
chat's system messages and tools end), when that is BRANCH_MIN_TOKENS past what the prompt is
served: an agent's conversations that share a long system prompt and tools, or a history
edited at one message, resume there.

A request that continues an entry's conversation (its prompt holds the entry's whole prompt)
takes the entry; one that branches off inside it (another conversation with the same system
prompt, an edited history) gets a copy, and the entry stays for its own conversation. A
recurrent entry is always copied: it is a fixed point that no later state can be rolled back
to. Copies are cheap (engine/session_copy.py).

Bounded by a byte budget over the stored entries' arrays; out first, the least recently used
of the entries whose tokens another entry nearly all holds, else the least recently used.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import mlx.core as mx

from ..errors import ParameterError
from .events import RoundEvent
from .generation import token_ids
from .loop import SpeculativeDecoder
from .session import Session
from .session_copy import clone_session, compact, session_arrays, session_nbytes
from ..values import is_int

log = logging.getLogger(__name__)


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the longest common prefix of a and b, at most `limit` (slice compares)."""
    n = min(len(a), len(b), limit)
    if n <= 0:
        return 0
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


# An entry all but this many of whose tokens (or an eighth of them) another entry holds is
# evicted first: what it alone holds is a short prefill away.
NEARLY_HELD_TOKENS = 32
# A recurrent state is also kept where a prompt branches off a stored one's prompt (another
# conversation with the same system prompt and tools, an edited message) when that is this
# many tokens past what the cache serves it: the next such branch resumes there.
BRANCH_MIN_TOKENS = 256


@dataclass
class _Entry:
    session: Session
    prompt_len: int  # the prompt of the request that stored it
    nbytes: int

    @property
    def fed(self) -> int:
        return self.session.fed

    @property
    def tokens(self) -> list[int]:
        return self.session.tokens


@dataclass(frozen=True)
class PromptCacheStats:
    hits: int  # leases that reused a stored prefix
    misses: int  # leases that started cold
    evictions: int  # entries dropped to stay within the budget
    entries: int
    nbytes: int
    max_bytes: int


class PromptCache:
    """Engine state of recent requests of one decoder, leased by prompt prefix.

    with cache.lease(prompt_ids) as lease:
        for ev in pair.stream(prompt_ids, params, lease.session):
            lease.observe(ev)
            ...
    """

    def __init__(self, decoder: SpeculativeDecoder, max_bytes: int):
        if not isinstance(decoder, SpeculativeDecoder):  # a Pair: its .decoder
            raise ParameterError(
                "decoder must be a SpeculativeDecoder (a Pair's .decoder), got a "
                f"{type(decoder).__name__}"
            )
        if not is_int(max_bytes, 1):
            raise ParameterError(f"max_bytes must be an int >= 1, got {max_bytes!r}")
        self.decoder = decoder
        self.max_bytes = max_bytes
        probe = decoder.target.make_cache()
        # Recurrent layers cannot roll back: keep the state at each prompt's last token too.
        self.trimmable = all(c.is_trimmable() for c in probe)
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self._next_key = 0
        self._lock = threading.Lock()
        self._bytes = 0
        self._hits = self._misses = self._evictions = 0
        self._said_too_large = False  # the note on a state past the budget: once

    def lease(self, prompt: Sequence[int], hints: Sequence[int] = ()) -> "Lease":
        """A session for `prompt`: the stored one that serves its longest prefix (taken, or
        copied when the prompt branches off inside it), else a fresh one. `hints`: prompt
        positions other prompts are known to share (a chat's system messages and tools),
        branch points for a recurrent state too."""
        prompt = token_ids(prompt, "prompt", self.decoder.target.vocab_size)
        taken = None  # the entry handed out itself (not a copy)
        with self._lock:
            key, served = self._best(prompt)
            if key is None:
                self._misses += 1
                session = None
            else:
                self._hits += 1
                entry = self._entries[key]
                if self.trimmable and served >= entry.prompt_len:  # its next request
                    taken = self._remove(key)
                    session = entry.session
                else:
                    self._entries.move_to_end(key)
                    session = clone_session(entry.session)
            branch = () if self.trimmable else (self._branch_point(prompt), *hints)
        if session is None:
            session = self.decoder.new_session()
        lease = Lease(self, session, len(prompt), served, taken)
        session.branch_points = tuple(
            sorted({p for p in branch if p - served >= BRANCH_MIN_TOKENS})
        )
        return lease

    def stats(self) -> PromptCacheStats:
        with self._lock:
            return PromptCacheStats(
                self._hits,
                self._misses,
                self._evictions,
                len(self._entries),
                self._bytes,
                self.max_bytes,
            )

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    # ------------------------------------------------------------------ internals
    def _serves(self, entry: _Entry, prompt: list[int]) -> int:
        """Prompt tokens `entry` can skip: its prefix shared with the prompt, short of the
        prompt's last token (fed anew for the first logits); a recurrent entry all or none."""
        shared = common_prefix(entry.tokens, prompt, min(entry.fed, len(prompt) - 1))
        if not self.trimmable and shared < entry.fed:
            return 0
        return shared

    def _best(self, prompt: list[int]) -> tuple[int | None, int]:
        best, served = None, 0
        for key, entry in self._entries.items():  # oldest first: ties go to the newest
            n = self._serves(entry, prompt)
            if n and n >= served:
                best, served = key, n
        return best, served

    def _branch_point(self, prompt: list[int]) -> int:
        """The longest prefix (short of its last token) `prompt` shares with a stored
        entry's prompt."""
        limit = len(prompt) - 1
        return max(
            (
                common_prefix(e.tokens, prompt, min(e.prompt_len, limit))
                for e in self._entries.values()
            ),
            default=0,
        )

    def _remove(self, key: int) -> _Entry:
        entry = self._entries.pop(key)
        self._bytes -= entry.nbytes
        return entry

    def _supersedes(self, new: _Entry, old: _Entry) -> bool:
        """`new` serves every prompt `old` serves."""
        if old.fed > new.fed or (not self.trimmable and old.fed != new.fed):
            return False
        return new.tokens[: old.fed] == old.tokens[: old.fed]

    def _store(self, session: Session, prompt_len: int) -> None:
        if session.in_round or session.fed == 0:  # interrupted mid-round: not consistent
            return
        compact(session)
        mx.eval(session_arrays(session))
        entry = _Entry(session, prompt_len, session_nbytes(session))
        with self._lock:
            if entry.nbytes > self.max_bytes:  # kept, it would push out every other one first
                self._evictions += 1
                if not self._said_too_large:
                    self._said_too_large = True
                    log.info(
                        "prompt cache: a state of %d tokens (%.0f MB) is more than the whole "
                        "budget (%.0f MB): not kept (raise --prompt-cache-mb to keep such)",
                        entry.fed,
                        entry.nbytes / 2**20,
                        self.max_bytes / 2**20,
                    )
                return
            for key in [k for k, e in self._entries.items() if self._supersedes(entry, e)]:
                self._remove(key)
            self._entries[self._next_key] = entry
            self._next_key += 1
            self._bytes += entry.nbytes
            while self._bytes > self.max_bytes:
                self._remove(self._victim())
                self._evictions += 1

    def _victim(self) -> int:
        """The entry to evict: the least recently used of those whose tokens another entry
        nearly all holds (losing it costs a short prefill: an editor's keystroke requests each
        branch off the last one near its end, and would otherwise push out a long
        conversation), else the least recently used."""
        if self.trimmable:
            for key, entry in self._entries.items():
                if self._nearly_held(key, entry):
                    return key
        return next(iter(self._entries))

    def _nearly_held(self, key: int, entry: _Entry) -> bool:
        need = entry.fed - max(NEARLY_HELD_TOKENS, entry.fed // 8)
        held = entry.tokens[: max(need, 0)]
        return any(
            k != key and other.fed >= need and other.tokens[: len(held)] == held
            for k, other in self._entries.items()
        )


class Lease:
    """One request's use of the cache: `session` for the engine; back into the cache on close.

    Pass every event of the generation to `observe`: the session goes back if its prefill
    finished, or stopped between chunks with what it holds consistent (Prefill.roll_back);
    not after a round stopped midway.
    """

    def __init__(
        self,
        cache: PromptCache,
        session: Session,
        prompt_len: int,
        served: int,
        taken: _Entry | None = None,
    ):
        self.cache, self.session = cache, session
        self.prompt_len = prompt_len
        self.served = served  # prompt tokens the session holds (the engine reports the same)
        self._prefilled = False
        self._closed = False
        self._taken = taken  # the stored entry itself: back as it was if nothing touched it
        self._as_leased = _positions(session)  # a prefill that begins changes it
        if not cache.trimmable:  # a recurrent state is kept at the prompt's last token too
            session.on_checkpoint = self._checkpoint

    def _checkpoint(self, session: Session) -> None:
        """The prefill has fed all of the prompt but its last token: a copy of the state
        there serves the same prompt sent again (a regeneration, a retry) and what a next
        turn usually shares (the template re-renders the answer); or it has fed up to a
        branch point, shared with another prompt."""
        self.cache._store(clone_session(session), self.prompt_len)

    def observe(self, event: RoundEvent) -> None:
        if event.prefill:
            self._prefilled = True

    def close(self) -> None:
        """Return the session (call once the generation has stopped)."""
        if self._closed:
            return
        self._closed = True
        self.session.on_checkpoint, self.session.branch_points = None, ()
        untouched = _positions(self.session) == self._as_leased
        if self._prefilled:
            self.cache._store(self.session, self.prompt_len)
        elif untouched and self._taken is not None:
            # refused before its prefill began (a bad parameter): the conversation stays
            self.cache._store(self.session, self._taken.prompt_len)
        elif not untouched and not self.session.in_round:
            # a prefill cancelled between chunks (Prefill.roll_back): what it kept stays, the
            # chunks it fed included (an editor's next keystroke prefills only the rest); an
            # untouched copy is not stored (it would replace the entry it was copied from)
            held = self._taken.prompt_len if self._taken is not None else self.prompt_len
            self.cache._store(self.session, min(held, self.session.fed))

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _positions(session: Session) -> tuple:
    """Where a session's tokens and caches stand (a prefill, even a trim, changes it)."""
    caches = session.target_cache + session.drafter_cache
    return len(session.tokens), session.in_round, tuple(getattr(c, "offset", None) for c in caches)
