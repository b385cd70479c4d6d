"""Regenerate training responses with the target model (DFlash recipe: the drafter learns the
target's own outputs).

For every prompt and temperature, the chat template is applied (add_generation_prompt=True) and
the target generates up to `max_new_tokens` tokens with mlx-lm's continuous-batching
`BatchGenerator`. Each finished sequence is appended to a JSONL file and flushed at once:

    {"id", "category", "temperature", "prompt_ids": [...], "response_ids": [...], "finish_reason"}

`response_ids` ends with the stop token (EOS) when `finish_reason` is "stop"; it is cut at
`max_new_tokens` when "length". Reruns skip the (id, temperature) pairs already in the file.

Sampling at T > 0 draws from what the library serves (train/regen_sampling.py). Seeded, but
at T > 0 the draws depend on how sequences share batches.

    python -m dflash2_mlx.train.regenerate --prompts train --out regen.jsonl   # embedded SmolLM2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from .. import _blas
from ..errors import DFlash2Error, ParameterError
from ..prompts import SPLITS, Prompt, load_prompts
from ..text import chat_prompt_ids
from .arg_types import float_in, int_at_least
from .eta import remaining
from .records import done_pairs, done_prompts
from .regen_sampling import make_sampler


@dataclass
class RegenStats:
    written: int = 0  # sequences appended by this call
    skipped: int = 0  # (id, temperature) pairs already in the file
    new_tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _Progress:
    """Decode throughput for the progress lines: over a window (reset at each line and each
    temperature) and over the whole call."""

    log: Callable[[str], None]
    start: float  # when the call began
    generated: int = 0  # every decoded token, finished sequences or not
    window_tokens: int = 0
    window_start: float = 0.0

    def begin(self, temp: float, todo: int, done: int) -> None:
        """A new window for temperature `temp`, and its first line."""
        self.window_tokens, self.window_start = 0, time.perf_counter()
        self.pass_start = self.window_start
        self.log(f"[regen] T={temp:g}: {todo} prompts to generate, {done} already done")

    def count_token(self) -> None:
        self.window_tokens += 1
        self.generated += 1

    def sync_and_report(self, fh, temp: float, finished: int, total: int) -> None:
        """fsync the records written so far, then log the throughput and start a new window."""
        now = time.perf_counter()
        os.fsync(fh.fileno())
        self.log(
            f"[regen] T={temp:g} {finished}/{total} done | "
            f"{self.window_tokens / max(now - self.window_start, 1e-9):.1f} tok/s "
            f"(last {self.window_tokens} tokens) | "
            f"{self.generated / max(now - self.start, 1e-9):.1f} tok/s overall | "
            f"{now - self.start:.0f} s "
            f"{remaining(now - self.pass_start, finished, total - finished)} at T={temp:g}"
        )
        self.window_tokens, self.window_start = 0, now


def _check_unchanged(tokenizer, prompts: list[Prompt], out: Path, encoded: dict) -> None:
    """A prompt skipped as done must be the one its answer was made for: the same id with
    other text (an edited prompt file) is refused, not trained on the old answer."""
    if not prompts:
        return
    _encode_prompts(tokenizer, prompts, encoded)
    stored = done_prompts(out)
    for p in prompts:
        if p.id in stored and stored[p.id] != encoded[p.id]:
            raise DFlash2Error(
                f"{out}: prompt {p.id!r} was answered for other text than it has now (an edited "
                "prompt file, or another target's chat template); give it a new id or use a "
                "new --work folder"
            )


def _encode_prompts(tokenizer, prompts: Iterable[Prompt], encoded: dict[str, list[int]]) -> None:
    """Adds the chat-templated ids of `prompts` not yet in `encoded` (shared across temperatures)."""
    for p in prompts:
        if p.id in encoded:
            continue
        if p.prompt_ids is not None:  # given as token ids: used as they are
            encoded[p.id] = list(p.prompt_ids)
            continue
        encoded[p.id] = chat_prompt_ids(tokenizer, p.messages)  # as the server renders it


def _batch_generator(
    net, tokenizer, temp: float, top_p: float, seed: int, max_new_tokens: int, batch_size: int
):
    """A seeded mlx-lm BatchGenerator sampling at `temp`, stopping at the tokenizer's EOS."""
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator

    mx.random.seed(seed)
    return BatchGenerator(
        net,
        max_tokens=max_new_tokens,
        sampler=make_sampler(temp, top_p, seed),
        stop_tokens=[[t] for t in tokenizer.eos_token_ids],
        completion_batch_size=batch_size,
        prefill_batch_size=min(8, batch_size),
    )


def _write_finished(
    gen,
    by_uid: dict[int, Prompt],
    encoded: dict[str, list[int]],
    temp: float,
    fh,
    stats: RegenStats,
    progress: _Progress,
    batch_size: int,
) -> None:
    """Decodes until `gen` is empty, appending each finished sequence to `fh` (flushed at once;
    fsynced, with a progress line, every `batch_size` sequences and at the last)."""
    tokens: dict[int, list[int]] = {u: [] for u in by_uid}
    finished = 0
    while responses := gen.next_generated():
        for r in responses:
            tokens[r.uid].append(int(r.token))
            progress.count_token()
            if r.finish_reason is None:
                continue
            p = by_uid[r.uid]
            rec = {
                "id": p.id,
                "category": p.category,
                "temperature": temp,
                "prompt_ids": encoded[p.id],
                "response_ids": tokens.pop(r.uid),
                "finish_reason": r.finish_reason,
            }
            fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
            fh.flush()
            stats.written += 1
            stats.new_tokens += len(rec["response_ids"])
            finished += 1
            if finished % batch_size == 0 or finished == len(by_uid):
                progress.sync_and_report(fh, temp, finished, len(by_uid))


def check_params(
    max_new_tokens: int, temps: list[float], top_p: float, batch_size: int, limit: int | None
) -> None:
    """Raises ParameterError naming the first parameter out of range (before a model loads)."""
    for name, value, ok, want in (
        ("max_new_tokens", max_new_tokens, max_new_tokens >= 1, ">= 1"),
        ("batch_size", batch_size, batch_size >= 1, ">= 1"),
        ("limit", limit, limit is None or limit >= 1, ">= 1 (or None: every prompt)"),
        ("top_p", top_p, 0 < top_p <= 1, "in (0, 1]"),
        (
            "temperatures",
            temps,
            bool(temps) and all(math.isfinite(t) and t >= 0 for t in temps),
            "one or more finite values >= 0",
        ),
    ):
        if not ok:
            raise ParameterError(f"regenerate: {name} must be {want}, got {value!r}")


def regenerate(
    model: str | Path | tuple,
    prompts: str | Path | Sequence[Prompt],
    out: str | Path,
    *,
    max_new_tokens: int = 256,
    temperatures: Iterable[float] = (0.0, 0.7),
    top_p: float = 0.95,
    batch_size: int = 32,
    seed: int = 0,
    limit: int | None = None,
    log: Callable[[str], None] | None = None,
    stats: RegenStats | None = None,
    prompt_ids: dict[str, list[int]] | None = None,
) -> RegenStats:
    """Generate target responses for `prompts` at each temperature and append them to `out`.

    `model` is an mlx-lm model folder or an already loaded `(model, tokenizer)` pair; `prompts` a
    split name ("train", "heldout"), a JSONL path or a list of Prompt. `batch_size` sequences
    decode together (continuous batching); a progress line is logged every `batch_size` finished
    sequences. `limit` keeps the first N prompts. Resumable: done (id, temperature) pairs are
    skipped. `stats` (returned) is updated as sequences are written, so that a caller that is
    interrupted still knows how many were. `prompt_ids`: token ids for some prompt ids, used
    as they are instead of their chat-templated messages (e.g. another record's prompt_ids).
    """
    temps = [float(t) for t in temperatures]
    check_params(max_new_tokens, temps, top_p, batch_size, limit)
    _blas.bind()
    from mlx_lm import load

    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    items = list(load_prompts(prompts) if isinstance(prompts, (str, Path)) else prompts)
    if limit is not None:
        items = items[:limit]
    if isinstance(model, tuple):
        net, tokenizer = model
    else:
        net, tokenizer = load(str(model))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = done_pairs(out)
    stats = stats if stats is not None else RegenStats()
    progress = _Progress(log, start=time.perf_counter())

    encoded = {k: list(v) for k, v in (prompt_ids or {}).items()}
    _check_unchanged(
        tokenizer, [p for p in items if any((p.id, t) in done for t in temps)], out, encoded
    )
    if all((p.id, t) in done for p in items for t in temps):  # read alone (a read-only --work)
        stats.skipped += len(items) * len(temps)
        return stats
    with open(out, "a", encoding="utf-8") as fh:
        for temp in temps:
            todo = [p for p in items if (p.id, temp) not in done]
            stats.skipped += len(items) - len(todo)
            if not todo:
                continue
            _encode_prompts(tokenizer, todo, encoded)
            todo.sort(key=lambda p: len(encoded[p.id]))  # similar lengths prefill together
            gen = _batch_generator(net, tokenizer, temp, top_p, seed, max_new_tokens, batch_size)
            uids = gen.insert([encoded[p.id] for p in todo], [max_new_tokens] * len(todo))
            progress.begin(temp, len(todo), len(items) - len(todo))
            try:
                _write_finished(
                    gen, dict(zip(uids, todo)), encoded, temp, fh, stats, progress, batch_size
                )
            finally:
                gen.close()
    stats.seconds = time.perf_counter() - progress.start
    return stats


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m dflash2_mlx.train.regenerate", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "--model", default=None, help="mlx-lm model folder (default: the embedded SmolLM2-135M)"
    )
    ap.add_argument(
        "--prompts",
        default="train",
        help=f"a bundled prompt split ({', '.join(SPLITS)}; '+' joins several) or a prompt "
        "JSONL path (default: %(default)s)",
    )
    ap.add_argument("--out", required=True, help="output JSONL (appended; resumable)")
    ap.add_argument(
        "--max-new-tokens",
        type=int_at_least(1),
        default=256,
        help="tokens a response may have at most (default: %(default)s)",
    )
    ap.add_argument(
        "--temperatures",
        type=float_in(0.0, math.inf, False, "a finite number >= 0"),
        nargs="+",
        default=[0.0, 0.7],
        help="one pass per temperature; 0 is greedy (default: 0 0.7)",
    )
    ap.add_argument(
        "--top-p",
        type=float_in(0.0, 1.0, True, "in (0, 1]"),
        default=0.95,
        help="nucleus mass sampled from at T > 0 (default: %(default)s)",
    )
    ap.add_argument(
        "--batch-size",
        type=int_at_least(1),
        default=32,
        help="sequences decoded together (default: %(default)s)",
    )
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    ap.add_argument(
        "--limit",
        type=int_at_least(1),
        default=None,
        help="only the first N prompts (default: all)",
    )
    return ap


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    from ..embedded import ensure_smollm2

    stats = RegenStats()
    try:
        regenerate(
            args.model or ensure_smollm2(),
            args.prompts,
            args.out,
            max_new_tokens=args.max_new_tokens,
            temperatures=args.temperatures,
            top_p=args.top_p,
            batch_size=args.batch_size,
            seed=args.seed,
            limit=args.limit,
            stats=stats,
        )
    except (DFlash2Error, ValueError, OSError) as exc:  # bad prompt/output files, fetch errors
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print(
            f"interrupted: {stats.written} sequences written to {args.out}; "
            "rerun the same command to resume",
            file=sys.stderr,
        )
        raise SystemExit(130) from None
    print(
        f"[regen] wrote {stats.written} sequences ({stats.new_tokens} tokens, "
        f"{stats.tokens_per_s:.1f} tok/s), skipped {stats.skipped} already done -> {args.out}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
