"""Response datastore: a third, model-free source of drafts (REST / SuffixDecoding style).

An index of responses the target wrote (the drafter's training regenerations, shipped beside
it as `datastore.npz`): when the last `min_match` committed tokens occur in it, the most
frequent continuation of their longest matching context there is proposed — if the answers
that continue it mostly agree on the next token (`min_share`); where they disagree, the round
is the drafter's, which reads this answer rather than others'. Like context
lookup it only proposes (a point mass the verify accepts or not), so greedy output stays
exactly the target's and sampling stays exact; rounds where it fires skip the drafter's pass.

The file holds the responses' token ids end to end (uint16 when the vocabulary allows),
each followed by a separator that no context token equals, so no match or continuation
crosses from one response into the next. The index (the sorted keys of every n-gram) is built
at load with numpy: about a second for the 3.3M tokens of the SmolLM2 drafter's file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import ConfigError
from ..values import is_int, is_number

DATASTORE_FILE = "datastore.npz"
# Held-out replay (docs/results/smollm2-datastore-gate.json): with the share gate, keys of 3
# tokens propose more often and as surely as 4 did without it.
DEFAULT_MIN_MATCH = 3
# A continuation is proposed when at least this share of the matched occurrences agree on its
# first token (one occurrence: always). Below it the drafter did better on the held-out
# replay; 0.6-0.99 all gave the same τ there.
DEFAULT_MIN_SHARE = 0.8
MAX_MATCH = 16  # context tokens compared at most when choosing the longest match
MAX_CANDIDATES = 4096  # occurrences of a key kept for the vote (the most frequent keys repeat)
# Tokens proposed at most by a datastore round (anchor excluded; also cut by the lookup block):
# continuations from other answers rarely stay right for long, and each row costs verify time.
DEFAULT_DATASTORE_LENGTH = 7


@dataclass(frozen=True)
class DatastoreMatch:
    """A proposal and why: the context tokens matched and the occurrences that agreed."""

    tokens: list[int]
    matched: int  # context tokens matched (min_match .. MAX_MATCH)
    support: int  # occurrences of that context in the datastore
    share: float  # of the occurrences with a next token, the share that agree on tokens[0]
    # per token: at least two occurrences reached it and all of them agree on it (accepted
    # 76-90 % on the held-out replay, the others 48-60 %: docs/results/smollm2-datastore-length.json)
    sure: tuple[bool, ...] = ()


def _keys(tokens: np.ndarray, n: int, base: int) -> np.ndarray:
    """A uint64 key per n-gram start (exact for n * log2(base) <= 64, else a hash that the
    caller confirms by comparing tokens)."""
    count = len(tokens) - n + 1
    wide = tokens.astype(np.uint64)
    keys = np.zeros(max(count, 0), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):
            keys *= np.uint64(base)
            keys += wide[k : k + count]
    return keys


class Datastore:
    """Sorted n-gram keys of a token stream -> where the n-grams start; `propose` follows the
    longest matching context's most frequent continuation."""

    def __init__(
        self,
        tokens: np.ndarray,
        separator: int,
        min_match: int = DEFAULT_MIN_MATCH,
        meta: dict | None = None,
        min_share: float = DEFAULT_MIN_SHARE,
    ):
        if not is_int(min_match, 1):
            raise ValueError(f"min_match must be an int >= 1, got {min_match!r}")
        if not is_number(min_share) or not 0.0 <= min_share <= 1.0:
            raise ValueError(f"min_share must be a number in [0, 1], got {min_share!r}")
        self.min_share = float(min_share)
        self.tokens = np.asarray(tokens)
        self.separator = int(separator)
        self.n = min_match
        self.meta = meta or {}
        self._base = self.separator + 1
        t = self.tokens
        keys = _keys(t, self.n, self._base)
        # An n-gram is indexed when it holds no separator and a token follows it.
        is_sep = (t == self.separator).astype(np.int32)
        seps = np.convolve(is_sep, np.ones(self.n, dtype=np.int32), mode="valid")
        ok = seps == 0
        ok[-1:] = False  # the last n-gram has nothing after it
        ok[: len(t) - self.n] &= t[self.n :] != self.separator
        starts = np.nonzero(ok)[0]
        # Not a stable sort (3x faster at load): _occurrences restores position order.
        order = np.argsort(keys[starts])
        self._starts = starts[order].astype(np.int64)
        self._sorted = keys[starts][order]

    @classmethod
    def load(
        cls,
        path: str | Path,
        min_match: int = DEFAULT_MIN_MATCH,
        min_share: float = DEFAULT_MIN_SHARE,
    ) -> "Datastore":
        """Read a datastore file (`train/datastore.py` writes it); a ConfigError names the
        file and what is wrong with it."""
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as f:
                tokens, separator = f["tokens"], int(f["separator"])
                meta = json.loads(str(f["meta"])) if "meta" in f else {}
        except Exception as exc:  # a truncated or empty file, a field of the wrong kind
            why = str(exc) or type(exc).__name__
            if "allow_pickle" in why:  # numpy's advice to trust the file: not ours to give
                why = "not a numpy .npz archive"
            raise ConfigError(f"{path}: cannot read it as a datastore: {why}") from None
        if tokens.ndim != 1 or tokens.dtype.kind != "u" or not tokens.size or separator < 1:
            raise ConfigError(
                f"{path}: 'tokens' must be a non-empty 1-D unsigned array and 'separator' >= 1 "
                f"(found {tokens.dtype} with shape {tokens.shape}, separator {separator})"
            )
        return cls(tokens, separator, min_match, meta, min_share)

    def __len__(self) -> int:
        return len(self.tokens)

    def max_token(self) -> int:
        """The largest token id it holds (-1: none), to check it against a target's vocabulary."""
        ids = self.tokens[self.tokens != self.separator]
        return int(ids.max()) if ids.size else -1

    def _occurrences(self, context: Sequence[int]) -> np.ndarray:
        """Where the continuations of the last n context tokens start (all occurrences)."""
        n = self.n
        tail = np.asarray(context[-n:], dtype=np.int64)
        if len(tail) < n or tail.min() < 0 or tail.max() >= self.separator:
            return self._starts[:0]
        key = _keys(tail.astype(np.uint64), n, self._base)[0]
        lo = np.searchsorted(self._sorted, key, side="left")
        hi = np.searchsorted(self._sorted, key, side="right")
        starts = self._starts[lo:hi]
        if len(starts) > MAX_CANDIDATES:  # the first occurrences in the file, on any machine
            starts = np.sort(starts)[:MAX_CANDIDATES]
        if self._base**n > 2**64 and len(starts):  # a hash: confirm the tokens
            same = np.all(self.tokens[starts[:, None] + np.arange(n)] == tail, axis=1)
            starts = starts[same]
        return starts + n

    def match(self, context: Sequence[int], length: int) -> DatastoreMatch | None:
        """The most frequent continuation (up to `length` tokens) of the longest context
        suffix (>= min_match tokens) found in the datastore; None when even the shortest
        is not there."""
        if length < 1 or len(context) < self.n:
            return None
        nxt = self._occurrences(context)
        if not len(nxt):
            return None
        matched = self.n
        t = self.tokens
        while matched < min(MAX_MATCH, len(context)):
            before = nxt - matched - 1  # the token before the matched span
            ok = before >= 0
            ok[ok] = t[before[ok]] == context[-matched - 1]
            if not ok.any():
                break
            nxt, matched = nxt[ok], matched + 1
        support, share = len(nxt), 0.0
        out: list[int] = []
        sure: list[bool] = []
        for _ in range(length):
            ids = t[nxt]
            live = ids != self.separator
            if not live.any():
                break
            values, counts = np.unique(ids[live], return_counts=True)
            top = np.argmax(counts)
            if not out:
                share = float(counts[top]) / float(live.sum())
            out.append(int(values[top]))
            sure.append(len(values) == 1 and int(counts[top]) >= 2)
            nxt = nxt[ids == values[top]] + 1
        return DatastoreMatch(out, matched, support, share, tuple(sure)) if out else None

    def propose(self, context: Sequence[int], length: int) -> list[int]:
        """The match's tokens when its occurrences agree enough on the first (min_share)."""
        found = self.match(context, length)
        if found is None or found.share < self.min_share:
            return []
        return found.tokens


def find_datastore(drafter_dir: str | Path | None) -> Path | None:
    """The drafter's shipped datastore file, if it has one."""
    if drafter_dir is None:
        return None
    path = Path(drafter_dir) / DATASTORE_FILE
    return path if path.is_file() else None
