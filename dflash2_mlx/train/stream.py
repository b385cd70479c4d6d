"""Streamed target features of fixed text: compute a shard, train on it, delete it.

5 tapped layers x 576 x fp16 is 5.8 KB a token for SmolLM2, so ten million tokens of text
would need 58 GB of cached features. The stream cuts its sequences (in their given, shuffled
order) into shards of at most `max_disk_bytes` each and keeps one shard on disk: the trainer
draws sequences from it, and after `passes` x (its sequences) draws the shard is deleted and
the next one is computed. Its position (shard, draws) is saved in the trainer's checkpoint;
a shard interrupted while being computed resumes from its last written piece (features.py).
"""

from __future__ import annotations

import math
import random
import shutil
from pathlib import Path
from typing import Callable, Sequence

from ..errors import DFlash2Error
from ..target.adapter import TargetAdapter
from .features import Sequence_, StoredSequence, build_feature_cache, load_feature_cache

INDEX_BYTES_PER_TOKEN = 16  # tokens + greedy labels as JSON in index.jsonl, roughly


def plan_shards(seqs: Sequence[Sequence_], shard_tokens: int) -> list[list[Sequence_]]:
    """Consecutive groups of at most shard_tokens tokens (a longer sequence goes alone)."""
    shards, cur, n = [], [], 0
    for s in seqs:
        if cur and n + len(s.tokens) > shard_tokens:
            shards.append(cur)
            cur, n = [], 0
        cur.append(s)
        n += len(s.tokens)
    if cur:
        shards.append(cur)
    return shards


def check_disk_bound(adapter: TargetAdapter, max_disk_bytes: int, longest: int) -> int:
    """Tokens of features a shard of `max_disk_bytes` holds; a DFlash2Error when that is
    less than `longest` (a sequence must fit in one shard)."""
    per_token = len(adapter.layer_ids) * adapter.hidden_size * 2 + INDEX_BYTES_PER_TOKEN
    tokens = max_disk_bytes // per_token
    if tokens < longest:
        raise DFlash2Error(
            f"--stream-disk-gb {max_disk_bytes / 1e9:g} holds {tokens} tokens of features, "
            f"less than the longest sequence's {longest}: raise it to at least "
            f"{math.ceil(longest * per_token / 1e6) / 1e3:g}"
        )
    return tokens


class FixedTextStream:
    def __init__(
        self,
        adapter: TargetAdapter,
        seqs: Sequence[Sequence_],
        folder: Path,
        *,
        max_disk_bytes: int,
        passes: float = 2.0,
        log: Callable[[str], None] = print,
    ):
        if not seqs:
            raise DFlash2Error("the fixed-text stream has no sequences")
        if passes <= 0:
            raise DFlash2Error(f"passes over each shard must be > 0 (got {passes})")
        self.adapter, self.folder, self.passes, self.log = adapter, Path(folder), passes, log
        self.shard_tokens = check_disk_bound(
            adapter, max_disk_bytes, max(len(s.tokens) for s in seqs)
        )
        self.shards = plan_shards(seqs, self.shard_tokens)
        self.index, self.draws, self.epoch = 0, 0, 0
        self._pool: list[StoredSequence] | None = None
        self.tokens = [s.tokens for s in seqs]  # every token the stream will show (vocab subset)

    # ------------------------------------------------------------ position
    def state(self) -> dict:
        return {"shard": self.index, "draws": self.draws, "epoch": self.epoch}

    def restore(self, state: dict) -> None:
        self.index, self.draws = int(state["shard"]) % len(self.shards), int(state["draws"])
        self.epoch, self._pool = int(state.get("epoch", 0)), None

    def shard_dir(self, i: int) -> Path:
        """Named by the plan too: a resume under another disk bound (other shards) computes
        its shard afresh instead of adding to what the old plan's left."""
        return self.folder / f"shard_{i:05d}_of_{self.shard_tokens}"

    def _budget(self) -> int:
        return max(1, round(self.passes * len(self.shards[self.index])))

    # ------------------------------------------------------------ data
    def pool(self) -> list[StoredSequence]:
        """The current shard's sequences (computed now if absent; others deleted first)."""
        if self._pool is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            mine = self.shard_dir(self.index)
            for old in self.folder.glob("shard_*"):
                if old != mine:
                    shutil.rmtree(old, ignore_errors=True)
            group = self.shards[self.index]
            self.log(
                f"fixed text: computing shard {self.index + 1}/{len(self.shards)} "
                f"({len(group)} sequences, {sum(len(s.tokens) for s in group):,} tokens)"
            )
            # written in pieces of 8k rows: an interrupted shard resumes from its last piece
            build_feature_cache(
                self.adapter, group, mine, greedy=True, shard_rows=8192, log=self.log
            )
            self._pool = load_feature_cache(mine)
        return self._pool

    def draw(self, rng: random.Random) -> StoredSequence:
        """One sequence of the current shard; moves on once the shard's budget is drawn."""
        if self.draws >= self._budget():
            if len(self.shards) > 1:  # a lone shard is kept: the next pass reads it again
                self._pool = None
                shutil.rmtree(self.shard_dir(self.index), ignore_errors=True)
            self.index, self.draws = self.index + 1, 0
            if self.index == len(self.shards):
                self.index, self.epoch = 0, self.epoch + 1
                self.log(f"fixed text: pass {self.epoch + 1} over the stream's shards")
        self.draws += 1
        return rng.choice(self.pool())

    def close(self) -> None:
        """Delete the stream's features and rewind it (a later run recomputes them)."""
        self._pool = None
        self.index = self.draws = self.epoch = 0
        shutil.rmtree(self.folder, ignore_errors=True)
