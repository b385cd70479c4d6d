"""Build a response datastore (engine/datastore.py) from regeneration JSONL files.

    python -m dflash2_mlx.train.datastore OUT.npz FILE.jsonl [FILE.jsonl ...]

Each record's `response_ids` go in end to end, each response followed by a separator; the
files' names, record and token counts and SHA-256 are kept in the file's `meta`. Give it the
target's answers to training-side prompts (the drafter's regenerations, and others it has not
trained on yet), never held-out ones (a datastore of the answers it is measured on would score
them by heart).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from ..engine.datastore import DATASTORE_FILE
from ..errors import ConfigError
from ..values import is_int


def read_responses(path: Path) -> list[list[int]]:
    """The `response_ids` of every record; a ConfigError names the file and line."""
    out = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                ids = json.loads(line)["response_ids"]
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(f"{path}:{line_no}: no response_ids list: {exc}") from None
            if not isinstance(ids, list) or not all(is_int(t, 0) for t in ids):
                raise ConfigError(f"{path}:{line_no}: response_ids must be a list of ids >= 0")
            out.append(ids)
    return out


def build(files: Sequence[str | Path], out: str | Path, note: str = "") -> dict:
    """Write the datastore of `files` to `out` (.npz); returns its meta."""
    files = [Path(f) for f in files]
    responses, sources = [], []
    for path in files:
        found = read_responses(path)
        responses += found
        sources.append(
            {
                "file": path.name,
                "records": len(found),
                "tokens": sum(map(len, found)),
                "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            }
        )
    if not any(responses):  # an empty store would be refused where it loads
        raise ConfigError(f"no response tokens in {', '.join(str(f) for f in files)}")
    data, meta = datastore_bytes(responses, sources, note)
    Path(out).write_bytes(data)
    return meta


def datastore_bytes(responses: list, sources: list[dict], note: str = "") -> tuple[bytes, dict]:
    """The .npz of `responses` (lists of token ids, not all empty) and its meta."""
    top = max((max(r) for r in responses if r), default=0)
    dtype = np.uint16 if top < np.iinfo(np.uint16).max else np.uint32
    separator = int(np.iinfo(dtype).max)
    if top >= separator:
        raise ConfigError(f"token id {top} does not fit the datastore's {dtype.__name__} ids")
    stream = np.fromiter((t for r in responses for t in (*r, separator)), dtype=dtype, count=-1)
    meta = {
        "what": "response datastore: training regenerations end to end, separator-joined",
        "sources": sources,
        "responses": len(responses),
        "tokens": int(len(stream) - len(responses)),
        "dtype": np.dtype(dtype).name,
        "note": note,
    }
    buffer = io.BytesIO()
    np.savez_compressed(buffer, tokens=stream, separator=np.int64(separator), meta=json.dumps(meta))
    return buffer.getvalue(), meta


def datastore_file(train: list, prompts) -> list[tuple[str, bytes]]:
    """The drafter's response datastore (engine/datastore.py): the target's answers it trained
    on, end to end (never the held-out ones), where there are any."""
    responses = [list(s.tokens[s.response_start :]) for s in train]
    if not any(responses):
        return []
    source = {"file": f"training regenerations ({prompts})", "records": len(responses)}
    source["tokens"] = sum(map(len, responses))
    data, _ = datastore_bytes(responses, [source], "written by dflash2 train")
    return [(DATASTORE_FILE, data)]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="the .npz to write (e.g. the drafter's datastore.npz)")
    ap.add_argument("files", nargs="+", type=Path, help="regeneration JSONL files")
    ap.add_argument("--note", default="", help="kept in the file's meta (e.g. which stage)")
    args = ap.parse_args(argv)
    meta = build(args.files, args.out, args.note)
    size = args.out.stat().st_size
    print(
        f"{args.out}: {meta['responses']:,} responses, {meta['tokens']:,} tokens, "
        f"{size / 1e6:.2f} MB"
    )


if __name__ == "__main__":
    main()
