"""Draft vocabulary: the token ids a drafter may propose, kept beside its checkpoint.

Drafting through the target's whole LM head costs a full read of it every round; restricted to
the tokens the drafter was trained to emit, the draft head is several times smaller (FR-Spec).
The file sits next to config.json + model.safetensors, which stay in the official format
(other loaders ignore it):

    draft_vocab.json  {"format": "dflash2-draft-vocab", "version": 1,
                       "token_ids": [...most frequent first], "counts": [...], "source": "..."}
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Iterable

from ..errors import CheckpointError
from ..values import is_int

DRAFT_VOCAB_FILE = "draft_vocab.json"
_FORMAT = "dflash2-draft-vocab"


def count_tokens(sequences: Iterable[Iterable[int]]) -> Counter:
    counts: Counter = Counter()
    for seq in sequences:
        counts.update(int(t) for t in seq)
    return counts


def draft_vocab_text(counts: Counter, source: str) -> str:
    """The file's text: every counted id, most frequent first (ties by id: deterministic)."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    body = {
        "format": _FORMAT,
        "version": 1,
        "source": source,
        "token_ids": [t for t, _ in ranked],
        "counts": [c for _, c in ranked],
    }
    return json.dumps(body) + "\n"


def write_draft_vocab(folder: str | Path, counts: Counter, source: str) -> Path:
    path = Path(folder) / DRAFT_VOCAB_FILE
    path.write_text(draft_vocab_text(counts, source))
    return path


def read_draft_vocab(folder: str | Path, vocab_size: int) -> list[int] | None:
    """The folder's draft vocabulary, or None when it has none. Errors name the file and field."""
    path = Path(folder) / DRAFT_VOCAB_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        raise CheckpointError(f'{path}: expected an object with "format": "{_FORMAT}"')
    if data.get("version") != 1:
        raise CheckpointError(
            f"{path}: field 'version' is {data.get('version')!r}; this dflash2 reads version 1"
        )
    ids = data.get("token_ids")
    if not isinstance(ids, list) or not ids:
        raise CheckpointError(f"{path}: field 'token_ids' must be a non-empty list of ids")
    bad = next((t for t in ids if not is_int(t, 0) or t >= vocab_size), None)
    if bad is not None:
        raise CheckpointError(
            f"{path}: field 'token_ids' holds {bad!r}; expected ints in "
            f"0..{vocab_size - 1} (the drafter's vocab_size is {vocab_size})"
        )
    if len(set(ids)) != len(ids):
        raise CheckpointError(f"{path}: field 'token_ids' repeats ids")
    return ids
