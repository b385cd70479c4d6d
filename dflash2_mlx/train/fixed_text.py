"""Fixed text (packaged corpora) labelled by the target, not by its own next tokens.

A prefill of text gives, at every position i, the target's greedy next token g[i] (argmax of
its distribution after x[..i]). For a block anchored at a (the drafter sees x[a] and the
target's features before a), the label of block position k (1..B-1) is g[a+k-1]: exact while
the text before it is on the target's greedy path. Position 1 is always exact; position k+1
stays exact only if x[a+k] == g[a+k-1]. So a block is supervised up to and including its
first position where the text leaves the greedy path, and no further (those labels would
need the target's continuation of its own choice, which a prefill does not compute).
"""

from __future__ import annotations

import json
import random
from bisect import bisect_left
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .corpus_sources import CorpusError, jsonl_lines
from .features import Sequence_


def agreement_runs(tokens: np.ndarray, greedy: np.ndarray) -> np.ndarray:
    """run[i] = how many consecutive positions from i on have x[j+1] == g[j] (0 at the end)."""
    agree = np.zeros(len(tokens), dtype=bool)
    agree[:-1] = tokens[1:] == greedy[:-1]
    run = np.zeros(len(tokens) + 1, dtype=np.int32)
    for i in range(len(tokens) - 1, -1, -1):
        run[i] = run[i + 1] + 1 if agree[i] else 0
    return run[:-1]


def supervised_lengths(tokens: np.ndarray, greedy: np.ndarray, block: int) -> np.ndarray:
    """m[a] = exactly-labelled positions of a block anchored at a: 1 + the agreement run, at
    most block - 1."""
    return np.minimum(1 + agreement_runs(tokens, greedy), block - 1)


def block_labels(
    tokens: np.ndarray, greedy: np.ndarray, anchors: Sequence[int], block: int
) -> tuple[np.ndarray, np.ndarray]:
    """(labels [n, B-1] = g[a .. a+B-2], mask [n, B-1] = 1 on the first m[a] positions)."""
    a = np.asarray(anchors, dtype=np.int64)[:, None]
    k = np.arange(block - 1)[None, :]
    labels = greedy[a + k].astype(np.int32)
    m = supervised_lengths(tokens, greedy, block)[a[:, 0]]
    return labels, (k < m[:, None]).astype(np.float32)


def anchor_pool(
    length: int, spans: Iterable[tuple[int, int]] | None, response_start: int, block: int
) -> np.ndarray:
    """Anchors whose first drafted token lies in an assistant span (all of them after
    response_start when no spans are known) and whose block fits in the sequence."""
    spans = list(spans) if spans else [(response_start, length)]
    hi = length - block
    pool = [np.arange(max(s - 1, 1), min(e - 1, hi + 1)) for s, e in spans]
    return np.concatenate(pool) if pool else np.zeros(0, dtype=np.int64)


def sample_weighted(pool: np.ndarray, weights: np.ndarray, n: int, rng: random.Random) -> list[int]:
    """n anchors from pool, preferring heavy ones: without replacement (Efraimidis-Spirakis
    keys u^(1/w)) when the pool is large enough, else with replacement."""
    if len(pool) >= n:
        keys = [rng.random() ** (1.0 / float(w)) for w in weights]
        top = np.argsort(keys)[-n:]
        return sorted(int(pool[i]) for i in top)
    return sorted(int(x) for x in rng.choices(list(pool), weights=list(weights), k=n))


def sample_text_anchors(
    tokens: np.ndarray,
    greedy: np.ndarray,
    spans,
    response_start: int,
    n: int,
    block: int,
    rng: random.Random,
) -> list[int] | None:
    """n anchors weighted by their supervised length (where the text agrees with the target,
    a block carries more exact labels); None when no block fits."""
    pool = anchor_pool(len(tokens), spans, response_start, block)
    if len(pool) == 0:
        return None
    weights = supervised_lengths(tokens, greedy, block)[pool]
    return sample_weighted(pool, weights, n, rng)


# ----------------------------------------------------------------- corpus -> token sequences
def render_with_spans(
    tokenizer, messages: list[dict], max_len: int
) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of the conversation rendered by the chat template, cut to max_len, and the
    [start, end) token spans of its assistant turns (turn header excluded, end-of-turn
    included), found by character offsets (a token straddling a turn's start is left out)."""
    inner = getattr(tokenizer, "_tokenizer", None)  # mlx-lm's wrapper holds the HF tokenizer
    hf = inner if hasattr(inner, "apply_chat_template") else tokenizer
    text = hf.apply_chat_template(messages, tokenize=False)
    # max_len tokens lie well inside this many characters: a 30,000-token record is not
    # tokenized whole (nor warned about) to keep its first 512
    enc = hf(text[: max_len * 16], add_special_tokens=False, return_offsets_mapping=True)
    ids, starts = list(enc["input_ids"]), [o[0] for o in enc["offset_mapping"]]
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        head = hf.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
        full = hf.apply_chat_template(messages[: i + 1], tokenize=False)
        if not (text.startswith(head) and text.startswith(full)):
            raise CorpusError(
                "the chat template does not render a conversation as a prefix of "
                "its continuation; fixed-text spans need that"
            )
        s, e = bisect_left(starts, len(head)), min(bisect_left(starts, len(full)), max_len)
        if e - s > 1:
            spans.append((s, e))
    return ids[:max_len], spans


def read_corpus(paths: Sequence[Path]) -> list[dict]:
    out = []
    for path in paths:
        for n, line in jsonl_lines(path):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CorpusError(f"{path}:{n}: not a corpus record ({exc})") from None
            missing = [k for k in ("id", "messages") if not isinstance(rec, dict) or k not in rec]
            if missing:
                raise CorpusError(
                    f'{path}:{n}: not a corpus record: a JSON object with "id" and '
                    f'"messages" is needed ({", ".join(missing)} missing)'
                )
            problem = _messages_problem(rec["messages"])
            if problem:
                raise CorpusError(f"{path}:{n}: messages {problem}")
            out.append(rec)
    return out


def _messages_problem(messages) -> str | None:
    """What keeps `messages` from being a chat with an answer to learn (None: nothing)."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return "must be a list of {role, content} objects"
    for i, m in enumerate(messages):
        if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return f"[{i}] needs a string role and a string content"
    roles = [m["role"] for m in messages]
    if "assistant" not in roles:
        return "hold no assistant turn (nothing to learn from)"
    if roles[0] == "assistant":
        return "begin with an assistant turn (a user or system turn comes first)"
    return None


def corpus_paths(spec: str | Path) -> list[Path]:
    """A corpus folder (every *.jsonl in it) or '+'-joined JSONL files."""
    p = Path(spec)
    if p.is_dir():
        paths = sorted(p.glob("*.jsonl"))
        if not paths:
            raise CorpusError(f"{p}: no *.jsonl corpus files (make them with `dflash2 corpus`)")
        return paths
    paths = [Path(x) for x in str(spec).split("+")]
    missing = [str(x) for x in paths if not x.exists()]
    if missing:
        raise CorpusError(f"corpus file(s) not found: {missing}")
    return paths


def corpus_sources(spec: str | Path) -> list[str]:
    """'name (package version, licence)' of each source a `dflash2 corpus` folder's
    manifest.json lists ([] for JSONL files or a folder without one)."""
    path = Path(spec) / "manifest.json"
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))["sources"]
        return [f"{e['source']} ({e['package']} {e['version']}, {e['licence']})" for e in entries]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def corpus_sequences(
    tokenizer, spec: str | Path, *, max_tokens: int, max_len: int = 512, seed: int = 0
) -> list[Sequence_]:
    """Records of the corpus, shuffled (seeded, sources interleaved), tokenized until
    `max_tokens` tokens are collected; each a Sequence_ with its assistant spans."""
    recs = read_corpus(corpus_paths(spec))
    random.Random(seed).shuffle(recs)
    out, total = [], 0
    for rec in recs:
        if total >= max_tokens:
            break
        try:
            tokens, spans = render_with_spans(tokenizer, rec["messages"], max_len)
        except CorpusError:
            raise
        except Exception as exc:  # the chat template's own refusal, whatever it raises
            raise CorpusError(f"{spec}: record {rec['id']!r}: the chat template: {exc}") from None
        if not spans:
            continue
        out.append(Sequence_(str(rec["id"]), 0.0, tokens, spans[0][0], tuple(spans)))
        total += len(tokens)
    if not out:
        raise CorpusError(f"{spec}: no record has an assistant turn within {max_len} tokens")
    return out
