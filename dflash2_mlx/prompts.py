"""Bundled chat prompts (train / held-out) and a strict JSONL loader.

Each line of a prompt file is `{"id": str, "category": str, "messages": [{"role", "content"}, ...]}`
where the messages end with a user turn. `load_prompts("train")` / `load_prompts("heldout")` read
the bundled sets (`train-wide`, `train-deep`, `train-broad`: 704, 1,070 and 1,300 more
hand-written prompts;
`train-extra`, `train-more`: template-built prompts that add variety for distillation, made by
tools/make_train_extra.py);
any other value is taken as a path; "a+b" joins several.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from .errors import DFlash2Error
from .values import is_int

ASSETS = Path(__file__).resolve().parent / "assets" / "prompts"
SPLITS = (
    "train",
    "train-wide",
    "train-deep",
    "train-broad",
    "train-extra",
    "train-more",
    "heldout",
)
_ROLES = {"system", "user", "assistant"}


class PromptFileError(DFlash2Error, ValueError):
    """A prompt file is missing, or one of its lines is malformed (message names file:line)."""


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    messages: list[dict[str, str]] = field(hash=False)
    # token ids to use as they are instead of the rendered messages (a regenerated record's)
    prompt_ids: tuple[int, ...] | None = field(default=None, hash=False)


def prompt_path(split: str | Path) -> Path:
    """The bundled file for a split name, else `split` as a path."""
    if isinstance(split, str) and split in SPLITS:
        return ASSETS / f"{split}.jsonl"
    return Path(split).expanduser()


def _parse(line: str) -> Prompt:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object")
    pid, category, messages = obj.get("id"), obj.get("category"), obj.get("messages")
    if not isinstance(pid, str) or not pid:
        raise ValueError("'id' must be a non-empty string")
    if not isinstance(category, str) or not category:
        raise ValueError("'category' must be a non-empty string")
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        if (
            not isinstance(m, dict)
            or m.get("role") not in _ROLES
            or not isinstance(m.get("content"), str)
        ):
            raise ValueError(f"messages[{i}] needs a role in {sorted(_ROLES)} and a string content")
        if not m["content"].strip():
            raise ValueError(f"messages[{i}] has empty content")
    if messages[-1]["role"] != "user":
        raise ValueError("the last message must be from the user")
    ids = obj.get("prompt_ids")
    if ids is not None and not (isinstance(ids, list) and ids and all(is_int(t, 0) for t in ids)):
        raise ValueError("'prompt_ids' must be a non-empty list of token ids (ints >= 0)")
    turns = [{"role": m["role"], "content": m["content"]} for m in messages]
    return Prompt(pid, category, turns, None if ids is None else tuple(ids))


def load_prompts(split: str | Path, *, skip_bad: bool = False) -> list[Prompt]:
    """Load a prompt JSONL file ("train", "heldout" or a path).

    A malformed or empty line raises PromptFileError naming the file and line number, or is skipped
    with a warning when `skip_bad` is true. Duplicate ids are errors too.
    """
    if isinstance(split, str) and "+" in split and not prompt_path(split).exists():
        if not all(part.strip() for part in split.split("+")):
            raise PromptFileError(f"{split!r}: an empty name before or after a '+'")
        return _joined([load_prompts(part, skip_bad=skip_bad) for part in split.split("+")], split)
    path = prompt_path(split)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte order mark is no part of it
    except OSError as exc:
        hint = ""
        if not path.exists() and path.suffix != ".jsonl" and len(path.parts) == 1:
            hint = f" (not a bundled split either: {', '.join(SPLITS)})"
        raise PromptFileError(
            f"cannot read prompt file {path}: {exc.strerror or exc}{hint}"
        ) from None
    except UnicodeDecodeError as exc:
        line = _line_at(path, exc.start)
        raise PromptFileError(
            f"{path}:{line}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
            f"{exc.start}): a prompt file is JSON lines"
        ) from None
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    lines = text.split("\n")
    while lines and not lines[-1].strip():
        lines.pop()  # the final newline (and blank lines after the last prompt)
    for lineno, line in enumerate(lines, start=1):
        try:
            if not line.strip():
                raise ValueError("empty line")
            prompt = _parse(line)
            if prompt.id in seen:
                raise ValueError(f"duplicate id {prompt.id!r} (first on line {seen[prompt.id]})")
        except ValueError as exc:
            msg = f"{path}:{lineno}: {exc}"
            if not skip_bad:
                raise PromptFileError(msg) from None
            warnings.warn(f"skipping bad prompt line: {msg}", stacklevel=2)
            continue
        seen[prompt.id] = lineno
        prompts.append(prompt)
    if not prompts:
        raise PromptFileError(f"{path}: no prompts")
    return prompts


def _line_at(path: Path, offset: int) -> int:
    """The 1-based line of byte `offset` in the file."""
    with open(path, "rb") as fh:
        return fh.read(offset).count(b"\n") + 1


def _joined(sets: list[list[Prompt]], name: str) -> list[Prompt]:
    out, seen = [], set()
    for prompts in sets:
        for p in prompts:
            if p.id in seen:
                raise PromptFileError(f"{name}: prompt id {p.id!r} appears in more than one set")
            seen.add(p.id)
            out.append(p)
    return out
