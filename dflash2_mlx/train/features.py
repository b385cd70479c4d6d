"""Target hidden states of `target_layer_ids`, computed once (teacher forcing) and cached on disk.

Layout of a feature folder:
    meta.json                 layer ids, feature width, dtype, target fingerprint
    index.jsonl               one line per sequence: id, temperature, shard, row, length, response_start
    shard_00000.npy ...       float16 [rows, N_f * H], sequences stored back to back

Shards are written atomically and the index is appended after each shard, so an interrupted
run (Ctrl-C, disk full) resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import mlx.core as mx
import numpy as np

from ..errors import DFlash2Error
from ..target.adapter import TargetAdapter
from .eta import remaining
from .records import read_records


class FeatureCacheError(DFlash2Error):
    """The feature cache cannot be written or does not match the target."""


@dataclass(frozen=True)
class Sequence_:
    id: str
    temperature: float
    tokens: list[int]
    response_start: int  # index of the first response token
    spans: tuple[tuple[int, int], ...] | None = None  # assistant turns [start, end) (fixed text)


@dataclass(frozen=True)
class StoredSequence:
    id: str
    temperature: float
    tokens: np.ndarray  # int32 [S]
    response_start: int
    features: np.ndarray  # float16 [S, N_f*H] (a view into a memory-mapped shard)
    greedy: np.ndarray | None = None  # int32 [S]: the target's argmax after each position
    spans: tuple[tuple[int, int], ...] | None = None  # assistant turns (fixed text)


def read_regenerations(path: Path, max_len: int) -> list[Sequence_]:
    """Records of regenerate.py, as sequences (prompt + response), cut to `max_len` tokens."""
    out = []
    for rec in read_records(path):
        prompt, resp = rec["prompt_ids"], rec["response_ids"]
        if not resp or len(prompt) + 1 >= max_len:
            continue
        out.append(Sequence_(rec["id"], rec["temperature"], (prompt + resp)[:max_len], len(prompt)))
    return out


def _key(seq_id: str, temperature: float) -> str:
    return f"{seq_id}@{temperature:g}"


def _check_meta(adapter: TargetAdapter, folder: Path) -> None:
    """Writes meta.json on the first run; later runs must be for the same target and layers."""
    meta_path = folder / "meta.json"
    meta = {
        "layer_ids": list(adapter.layer_ids),
        "width": len(adapter.layer_ids) * adapter.hidden_size,
        "dtype": "float16",
        "model_type": adapter.model_type,
        "vocab": adapter.vocab_size,
    }
    if meta_path.exists():
        with _intact(folder):
            old = json.loads(meta_path.read_text())
        if old != meta:
            raise FeatureCacheError(
                f"{folder}: cached features were made for {old}, not {meta}; "
                "use another --features folder"
            )
    else:
        meta_path.write_text(json.dumps(meta))


def _read_index(index_path: Path) -> tuple[set[str], int]:
    """The keys of the sequences already cached, and the number of the next shard."""
    done = set()
    shard_no = 0
    if index_path.exists():
        with _intact(index_path.parent):
            for line in index_path.read_text().splitlines():
                rec = json.loads(line)
                done.add(_key(rec["id"], rec["temperature"]))
                shard_no = max(shard_no, rec["shard"] + 1)
    return done, shard_no


@contextlib.contextmanager
def _intact(folder: Path):
    """A cache file that does not read (cut short by a kill, edited) as one error naming the
    folder and what to do."""
    try:
        yield
    except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
        raise FeatureCacheError(
            f"{folder}: the feature cache is damaged ({str(exc)[:160]}): delete the folder, "
            "and the next run computes its features again"
        ) from None


@dataclass
class _ShardWriter:
    """The shard being filled: its rows and index entries, written by flush()."""

    folder: Path
    done: set[str]  # keys of the sequences cached (in the index)
    shard_no: int
    rows: list[np.ndarray] = field(default_factory=list)
    entries: list[dict] = field(default_factory=list)
    n_rows: int = 0

    def add(self, s: Sequence_, features: np.ndarray, greedy: list[int] | None) -> None:
        entry = {
            "id": s.id,
            "temperature": s.temperature,
            "shard": self.shard_no,
            "row": self.n_rows,
            "length": len(s.tokens),
            "response_start": s.response_start,
            "tokens": s.tokens,
        }
        if greedy is not None:
            entry["greedy"] = greedy
        if s.spans:
            entry["spans"] = [list(x) for x in s.spans]
        self.entries.append(entry)
        self.rows.append(features)
        self.n_rows += len(s.tokens)

    def flush(self) -> None:
        """Writes the shard atomically, then appends its entries to the index (resume point)."""
        if not self.rows:
            return
        path = self.folder / f"shard_{self.shard_no:05d}.npy"
        tmp = path.with_suffix(".tmp.npy")
        try:
            np.save(tmp, np.concatenate(self.rows, axis=0))
            os.replace(tmp, path)
            with open(self.folder / "index.jsonl", "a") as fh:
                fh.writelines(json.dumps(e) + "\n" for e in self.entries)
        except OSError as exc:
            with contextlib.suppress(OSError):  # a read-only folder refuses this too
                tmp.unlink(missing_ok=True)
            # numpy's short write carries no errno: "N requested and M written"
            full = exc.errno == errno.ENOSPC or "requested and" in str(exc)
            why = "the disk is full" if full else exc.strerror or str(exc)
            raise FeatureCacheError(
                f"{self.folder}: cannot write {path.name}: {why}. "
                f"{'Free space' if full else 'Fix that'} and rerun: "
                f"{len(self.done)} sequences are cached and will be kept"
            ) from None
        self.done.update(_key(e["id"], e["temperature"]) for e in self.entries)
        self.rows, self.entries, self.n_rows = [], [], 0
        self.shard_no += 1


def target_features(
    adapter: TargetAdapter, group: Sequence[Sequence_], greedy: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """float16 features of `group` (padded to its longest) and, with `greedy`, the target's
    argmax at every position."""
    width = max(len(s.tokens) for s in group)
    ids = mx.array([s.tokens + [0] * (width - len(s.tokens)) for s in group])
    # right padding: causal, harmless
    fwd = adapter.forward(ids, None, last_logits_only=not greedy)
    feats = np.array(fwd.features.astype(mx.float16))
    top = np.array(mx.argmax(fwd.logits, axis=-1)) if greedy else None
    return feats, top


def build_feature_cache(
    adapter: TargetAdapter,
    seqs: Sequence[Sequence_],
    folder: Path,
    *,
    batch: int = 8,
    shard_rows: int = 32768,
    greedy: bool = False,
    log=print,
) -> Path:
    """Compute and store features for `seqs` not yet in `folder` (resumable). `greedy`: also
    store the target's argmax next token at every position (labels of fixed text)."""
    folder.mkdir(parents=True, exist_ok=True)
    _check_meta(adapter, folder)
    done, shard_no = _read_index(folder / "index.jsonl")
    todo = sorted(
        (s for s in seqs if _key(s.id, s.temperature) not in done), key=lambda s: len(s.tokens)
    )
    shard = _ShardWriter(folder, done, shard_no)
    cached, total = len(done), len(done) + len(todo)
    if todo:
        log(f"features: {len(todo)} sequences to compute ({cached} cached) in {folder}")
    t0, tokens, todo_tokens = time.perf_counter(), 0, sum(len(s.tokens) for s in todo)
    for start in range(0, len(todo), batch):
        group = todo[start : start + batch]
        feats, top = target_features(adapter, group, greedy)
        for j, (s, f) in enumerate(zip(group, feats)):
            n = len(s.tokens)
            tokens += n
            shard.add(s, f[:n], None if top is None else top[j, :n].tolist())
        if shard.n_rows >= shard_rows:
            shard.flush()  # a stop loses at most the rows not yet written
            took = time.perf_counter() - t0
            log(
                f"features: {cached + start + len(group)}/{total} sequences, "
                f"{tokens / took:.0f} tok/s, {remaining(took, tokens, todo_tokens - tokens)}"
            )
    shard.flush()
    if todo:
        log(f"features: {total}/{total} sequences")
    return folder


def load_feature_cache(folder: Path) -> list[StoredSequence]:
    index_path = folder / "index.jsonl"
    if not index_path.exists():
        raise FeatureCacheError(f"{folder}: no index.jsonl (build the feature cache first)")
    with _intact(folder):
        return _read_cache(folder, index_path)


def _read_cache(folder: Path, index_path: Path) -> list[StoredSequence]:
    shards: dict[int, np.ndarray] = {}
    out = []
    for line in index_path.read_text().splitlines():
        e = json.loads(line)
        if e["shard"] not in shards:
            shards[e["shard"]] = np.load(folder / f"shard_{e['shard']:05d}.npy", mmap_mode="r")
        feats = shards[e["shard"]][e["row"] : e["row"] + e["length"]]
        greedy = np.array(e["greedy"], dtype=np.int32) if "greedy" in e else None
        spans = tuple(tuple(x) for x in e["spans"]) if "spans" in e else None
        out.append(
            StoredSequence(
                e["id"],
                e["temperature"],
                np.array(e["tokens"], dtype=np.int32),
                e["response_start"],
                feats,
                greedy,
                spans,
            )
        )
    return out


def feature_scale(
    seqs: Iterable[StoredSequence], sample_rows: int = 20000, skip_first: int = 4
) -> np.ndarray:
    """Per-dimension 1/RMS of the features (early sink rows skipped), so a few massive
    dimensions do not dominate `fc`'s input. Folded into fc.weight when saving."""
    acc, n = None, 0
    for s in seqs:
        f = np.asarray(s.features[skip_first:], dtype=np.float32)
        acc = (f**2).sum(0) if acc is None else acc + (f**2).sum(0)
        n += f.shape[0]
        if n >= sample_rows:
            break
    rms = np.sqrt(acc / max(n, 1))
    return (1.0 / np.maximum(rms, 1e-3)).astype(np.float32)
