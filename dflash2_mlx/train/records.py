"""Regeneration files (JSONL, one record a line, appended by regenerate.py): reading them,
and the (id, temperature) pairs a rerun skips."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from ..errors import DFlash2Error


class RegenerationFileError(DFlash2Error, ValueError):
    """A line of a regeneration file is not a regeneration record."""


def read_records(path: Path) -> Iterator[dict]:
    """The records of a regeneration file, the one reader of the format above (blank lines
    skipped); a line that is not a record raises RegenerationFileError naming file and line."""
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                rec["id"], rec["temperature"] = str(rec["id"]), float(rec["temperature"])
                rec["prompt_ids"], rec["response_ids"] = (
                    list(rec["prompt_ids"]),
                    list(rec["response_ids"]),
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise RegenerationFileError(
                    f"{path}:{lineno}: not a regeneration record ({exc})"
                ) from None
            yield rec


def done_prompts(out: Path) -> dict[str, list[int]]:
    """The prompt ids each written record was regenerated from, by prompt id."""
    if not out.exists():
        return {}
    return {rec["id"]: rec["prompt_ids"] for rec in read_records(out)}


def done_pairs(out: Path) -> set[tuple[str, float]]:
    """(id, temperature) pairs already written; drops a torn last line left by a crash."""
    if not out.exists():
        return set()
    data = out.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(out, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)
    return {(rec["id"], rec["temperature"]) for rec in read_records(out)}
