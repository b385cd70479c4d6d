"""What `dflash2 train` checks before any work: where it writes, and settings that would
otherwise fail, hang or mislead only after hours of regeneration."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from ..errors import DFlash2Error, ParameterError
from ..prompts import load_prompts
from .config import TrainConfig

# Files only `dflash2 train` writes: a drafter folder's record, an ablation's summary.
TRAINING_RECORDS = ("training.json", "ablation.json")
# Settings a resumed run may change: its length, the data mix, how often it reports.
RESUMABLE_CHANGES = frozenset(
    {
        "steps",
        "command",
        "init_from",
        "init_from_target",
        "fixed_ratio",
        "fixed_distill_weight",
        "eval_every",
        "checkpoint_every",
    }
)


def check_out(out: Path, work: Path) -> None:
    """--out must be a folder this run may write: new, empty, or a drafter dflash2 trained
    (its files are replaced); --work must be creatable. Both are made now, so a typo costs
    nothing."""
    if out.exists() and not out.is_dir():
        raise ParameterError(f"--out {out}: is a file; name a folder for the drafter")
    ours = any((out / name).exists() for name in TRAINING_RECORDS)
    if out.is_dir() and any(out.iterdir()) and not ours:
        names = ", ".join(sorted(p.name for p in out.iterdir())[:4])
        raise ParameterError(
            f"--out {out}: holds files dflash2 train did not write ({names}); the drafter "
            "would replace them: name a new or empty folder"
        )
    for flag, folder in (("--out", out), ("--work", work)):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ParameterError(f"{flag} {folder}: cannot create it: {e.strerror or e}") from None


def claim_run(run: Path, out: Path) -> None:
    """A work folder's run (named after --out's last part) trains one --out: another folder
    of the same name must not resume its checkpoint."""
    mark, mine = run / "out.txt", str(out.resolve())
    if mark.exists() and (theirs := mark.read_text(encoding="utf-8").strip()) != mine:
        raise ParameterError(
            f"{run} holds the training of --out {theirs}, not {mine}: give another --work "
            "(or --out name)"
        )
    run.mkdir(parents=True, exist_ok=True)
    mark.write_text(mine + "\n", encoding="utf-8")


def check_settings(tc: TrainConfig, max_new_tokens: int, temperatures) -> None:
    """Settings that can only fail later: answers too short to hold one block (the trainer
    would find no anchor), negative temperatures, exclusive starts."""
    if max_new_tokens < tc.block_size:
        raise ParameterError(
            f"--max-new-tokens {max_new_tokens} must be at least --block-size "
            f"{tc.block_size}: a training anchor needs a block of the answer after it"
        )
    bad = [t for t in temperatures if t < 0]
    if bad:
        raise ParameterError(f"--temperatures must be >= 0 (got {bad[0]:g})")
    if tc.init_from_target and tc.init_from:
        raise ParameterError("--init-from-target and --init-from are exclusive: pick one start")


def check_heldout_apart(train_spec: str, heldout_spec: str, skip_bad: bool) -> None:
    """The held-out prompts must not be training prompts (τ would be measured on training
    data): none may share a conversation with a training prompt."""
    seen = {_key(p.messages): p.id for p in load_prompts(train_spec, skip_bad=skip_bad)}
    for p in load_prompts(heldout_spec, skip_bad=skip_bad):
        if _key(p.messages) in seen:
            raise ParameterError(
                f"--heldout {heldout_spec}: prompt {p.id!r} is also training prompt "
                f"{seen[_key(p.messages)]!r} in --prompts; held-out prompts must be unseen"
            )


def _key(messages) -> str:
    return json.dumps(messages, sort_keys=True)


def check_resumable(state: dict, cfg: TrainConfig, ckpt: Path) -> None:
    """A checkpoint resumes only under the settings it was trained with (the length and
    the data mix may change); a setting it did not record is not compared."""
    saved, now = state.get("config") or {}, asdict(cfg)
    differ = [
        k
        for k, v in now.items()
        if k not in RESUMABLE_CHANGES and saved.get(k) is not None and _same(saved[k]) != _same(v)
    ]
    if differ:
        shown = "; ".join(f"{k} {saved[k]} there, {now[k]} now" for k in differ[:4])
        raise DFlash2Error(
            f"{ckpt} holds a checkpoint trained with other settings ({shown}): rerun with "
            "those to resume it, or give another --out or --work to start afresh"
        )


def _same(value):
    return list(value) if isinstance(value, (tuple, list)) else value


def check_anchorable(train: list, block: int) -> None:
    """At least one training sequence must hold an anchor (a whole block of answer)."""
    longest = max((len(s.tokens) - s.response_start for s in train), default=0)
    if longest < block - 1:  # batches.sample_anchors' bound
        raise ParameterError(
            f"no training answer is longer than the block size {block} (the longest: "
            f"{longest} tokens): raise --max-new-tokens or lower --block-size"
        )
