"""What `dflash2 train` checks before any work: where it writes, and settings that would
otherwise fail, hang or mislead only after hours of regeneration."""

from __future__ import annotations

import hashlib
import json
import math
import os
import warnings
from dataclasses import asdict
from pathlib import Path

from ..errors import DFlash2Error, ParameterError
from ..prompts import load_prompts
from .config import TrainConfig
from .resume import read_state

# Files only `dflash2 train` writes in --out: its marker (made when the run starts), a
# drafter folder's record, an ablation's summary.
MARKER = ".dflash2-train"
OURS = (MARKER, "training.json", "ablation.json")
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


def check_nesting(out: Path, work: Path) -> None:
    """--out holds the drafter alone and --work is deleted once the drafter is final: they
    may not nest."""
    if _inside(work, out) or _inside(out, work):
        raise ParameterError(
            f"--work {work} and --out {out} nest: --out holds the drafter alone, and --work "
            "is deleted once the drafter is final; name folders side by side"
        )


def _inside(folder: Path, parent: Path) -> bool:
    """`folder` is `parent` or below it (as resolved: symlinks, "..")."""
    folder, parent = folder.resolve(), parent.resolve()
    return folder == parent or parent in folder.parents


def check_config(tc: TrainConfig, *, ablation: bool = False) -> None:
    """Settings that contradict each other or would train nothing, named by their flags."""
    if not tc.lr > 0:
        raise ParameterError(
            f"--lr {tc.lr:g} would leave the drafter as it starts: give a learning rate > 0"
        )
    neutral = not tc.train_conv or tc.selector_weight == 0  # --no-conv / --no-selector
    if tc.version == 1 and neutral:
        raise ParameterError("--no-conv / --no-selector are DFlash2 parts; --version 1 has neither")
    if ablation and (neutral or tc.version != 2):
        raise ParameterError(
            "--ablation trains every variant itself; drop --version / --no-conv / --no-selector"
        )
    if tc.init_from and (ablation or neutral):
        # the start's trained convs and selector would stay in: not the neutral parts asked for
        raise ParameterError(
            "--init-from keeps its drafter's trained convs and selector: it cannot start "
            + ("an --ablation" if ablation else "with --no-conv / --no-selector")
        )
    if tc.fixed_ratio > 0 and round(tc.fixed_ratio * tc.batch_seqs) == 0:
        raise ParameterError(
            f"--corpus-ratio {tc.fixed_ratio:g} of --batch {tc.batch_seqs} rounds to no corpus "
            "sequence per batch: raise either (or give 0 to only widen the vocabulary)"
        )


def check_out(out: Path, work: Path, *, write: bool = True) -> None:
    """--out must be a folder this run may write: new, empty (dotfiles aside), or one that
    dflash2 train wrote (its files are replaced), beside --work (check_nesting), which must be
    creatable. Both are made now (unless `write` is false: the checks alone), so a typo costs
    nothing."""
    check_nesting(out, work)
    if out.exists() and not out.is_dir():
        raise ParameterError(f"--out {out}: is a file; name a folder for the drafter")
    if out.is_dir() and not any((out / name).exists() for name in OURS):
        others = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
        if others:
            raise ParameterError(
                f"--out {out}: holds files dflash2 train did not write ({', '.join(others[:4])}); "
                "the drafter would replace them: name a new or empty folder"
            )
    _check_work(work)
    if not write:
        return
    for flag, folder in (("--out", out), ("--work", work)):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ParameterError(f"{flag} {folder}: cannot create it: {e.strerror or e}") from None
    try:
        (out / MARKER).write_text("written by dflash2 train: a rerun may replace its files\n")
    except OSError as e:
        raise ParameterError(f"--out {out}: cannot write in it: {e.strerror or e}") from None


def _check_work(work: Path) -> None:
    """--work is a folder of regenerations and checkpoints, deleted once the drafter is
    final: never a file, a model's folder or a drafter's."""
    if work.exists() and not work.is_dir():
        raise ParameterError(f"--work {work}: is a file; name a folder for the work files")
    held = [n for n in (*OURS, "config.json", "model.safetensors") if (work / n).exists()]
    if held:
        raise ParameterError(
            f"--work {work}: holds a model or a drafter ({held[0]}), and a work folder is "
            "deleted once its drafter is final: name another folder"
        )


def _same_path(a: Path, b: Path) -> bool:
    """One folder (symlinks, a case-insensitive file system), or the same resolved path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def check_claim(run: Path, out: Path) -> None:
    """A work folder's run (named after --out's last part) trains one --out: another folder
    of the same name must not resume its checkpoint."""
    mark = run / "out.txt"
    if mark.exists():
        theirs = mark.read_text(encoding="utf-8").strip()
        if not _same_path(Path(theirs), out):
            raise ParameterError(
                f"{run} holds the training of --out {theirs}, not {out.resolve()}: give "
                "another --work (or --out name)"
            )


def claim_run(run: Path, out: Path) -> None:
    check_claim(run, out)
    if (run / "out.txt").exists():
        return  # ours (check_claim): nothing to write
    run.mkdir(parents=True, exist_ok=True)
    (run / "out.txt").write_text(str(out.resolve()) + "\n", encoding="utf-8")


def check_earlier_run(run: Path, out: Path, cfg: TrainConfig) -> None:
    """What resuming `run` would refuse after the data stage (another --out's run, other
    settings, a checkpoint past --steps), refused before it; settings the target resolves
    and `cfg` leaves unset (layer ids, mask id) are compared at the resume."""
    check_claim(run, out)
    state = run / "checkpoint" / "state.json"
    if state.exists():
        check_resumable(read_state(state), cfg, state.parent)


def check_settings(tc: TrainConfig, max_new_tokens: int, temperatures) -> None:
    """Settings that can only fail later: answers too short to hold one block (the trainer
    would find no anchor), negative or non-finite temperatures, exclusive starts; and
    `check_config`'s."""
    check_config(tc)
    if max_new_tokens < tc.block_size - 1:
        raise ParameterError(
            f"--max-new-tokens {max_new_tokens} must be at least --block-size - 1 "
            f"({tc.block_size - 1}): a training anchor needs that much answer after it"
        )
    bad = [t for t in temperatures if not (math.isfinite(t) and t >= 0)]
    if bad:
        raise ParameterError(
            f"temperatures (--temperatures, or NAME@T in --prompts) must be finite and >= 0 "
            f"(got {bad[0]:g})"
        )
    if tc.init_from_target and tc.init_from:
        raise ParameterError("--init-from-target and --init-from are exclusive: pick one start")


def check_inputs(target: Path, corpus: str | None, init_from: Path | None) -> None:
    """What the run reads, before anything is written or loaded: model folders (as fetched)
    that hold a config.json, corpus records that parse."""
    for flag, folder in (("target", target), ("--init-from", init_from)):
        if folder is not None and not (folder / "config.json").is_file():
            raise ParameterError(
                f"{flag} {folder}: no config.json (not a model folder: mlx-lm targets and "
                "dflash2 drafters have one)"
            )
    if corpus:
        from .fixed_text import corpus_paths, read_corpus

        if not read_corpus(corpus_paths(corpus)):
            raise ParameterError(f"--corpus {corpus}: no records (make them with `dflash2 corpus`)")


def check_heldout_apart(train_spec: str, heldout_spec: str, skip_bad: bool) -> None:
    """The held-out prompts must not be training prompts (τ would be measured on training
    data): none may have a training prompt's exact messages."""
    with warnings.catch_warnings():  # a skipped line is reported when the run reads it
        warnings.simplefilter("ignore")
        train = load_prompts(train_spec, skip_bad=skip_bad)
        held = load_prompts(heldout_spec, skip_bad=skip_bad)
    seen = {_key(p.messages): p.id for p in train}
    for p in held:
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
        if k not in RESUMABLE_CHANGES
        and None not in (saved.get(k), v)
        and _same(saved[k]) != _same(v)
    ]
    afresh = f"or delete {ckpt.parent} to train afresh (the data in --work stays)"
    if differ:
        shown = "; ".join(f"{k} {saved[k]!r} there, {now[k]!r} now" for k in differ[:4])
        raise DFlash2Error(
            f"{ckpt} holds a checkpoint trained with other settings ({shown}): rerun with "
            f"those to resume it, {afresh}"
        )
    if state.get("step", 0) > cfg.steps:
        raise ParameterError(
            f"{ckpt} is at step {state['step']}, past --steps {cfg.steps}: give --steps at "
            f"least that to resume it, {afresh}"
        )


def _same(value):
    return list(value) if isinstance(value, (tuple, list)) else value


def check_anchorable(train: list, block: int, what: str = "training") -> None:
    """At least one answer must hold a block after an anchor: block - 1 tokens
    (batches.sample_anchors' bound), else the trainer would find no anchor (held-out: τ
    would be measured on nothing)."""
    longest = max((len(s.tokens) - s.response_start for s in train), default=0)
    if longest < block - 1:
        raise ParameterError(
            f"no {what} answer holds the {block - 1} tokens a block of {block} needs after "
            f"its anchor (the longest: {longest} tokens): raise --max-new-tokens or lower "
            "--block-size"
        )


WORK_IDENTITY = "work.json"
# the names pipeline.py gives what it writes in --work
WORK_PREFIXES = ("regen_", "features_", "run-", "stream_")


def files_not_ours(work: Path) -> list[str]:
    """The names in --work that dflash2 train did not write (a staged prompt file, a user's
    own files where --work named a folder of theirs): never to be deleted with its work."""
    if not work.is_dir():
        return []
    names = (p.name for p in work.iterdir())  # .git, .env: a folder of one's own too
    return sorted(n for n in names if n != WORK_IDENTITY and not n.startswith(WORK_PREFIXES))


def target_fingerprint(target: Path) -> str:
    """A cheap identity of a model folder: its config and, per weights file, its size and
    first and last MiB (another fine-tune of the same shapes differs there; hashing all of a
    27B model's weights would take minutes)."""
    h = hashlib.sha256((target / "config.json").read_bytes())
    for f in sorted(target.glob("*.safetensors")):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(2**20))
            fh.seek(max(size - 2**20, 0))
            h.update(fh.read(2**20))
    return h.hexdigest()[:24]


def check_work_identity(work: Path, target: Path, max_new_tokens: int, max_len: int) -> None:
    """A work folder's regenerations and features belong to one target and answer length:
    a rerun with another is refused (they would be reused as they are), the first run
    records them."""
    mine = {
        "target": target_fingerprint(target),
        "max_new_tokens": max_new_tokens,
        "max_len": max_len,
    }
    path = work / WORK_IDENTITY
    if not path.exists():
        work.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(mine, indent=1))
        return
    try:
        theirs = json.loads(path.read_text())
        if not isinstance(theirs, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        raise ParameterError(
            f"{path}: damaged ({str(exc)[:120]}); it records the target and lengths this "
            "folder's regenerations and features were made with: use a new --work folder"
        ) from None
    what = {"target": "another target (its config or weights differ)"}
    for key, value in mine.items():
        if theirs.get(key, value) != value:
            made = what.get(key, f"--{key.replace('_', '-')} {theirs[key]} (now {value})")
            raise ParameterError(
                f"--work {work}: its regenerations and features were made with {made}; "
                "they would be reused as they are: use a new --work folder"
            )
