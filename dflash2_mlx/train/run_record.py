"""A run's record in its drafter folder (training.json): what it holds, and whether a rerun of
the command finds its own export there."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from ..errors import DFlash2Error
from .pipeline_config import PipelineConfig, prompt_parts

# PipelineConfig fields that say what a drafter is trained on.
DATA_FIELDS = ("prompts", "temperatures", "corpus", "corpus_tokens")


def pipeline_record(pc: PipelineConfig) -> dict:
    """`pc` as training.json records it (plain JSON values)."""
    fields = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(pc).items()}
    return json.loads(json.dumps(fields, default=str))


def exported_record(pc: PipelineConfig, step: int) -> dict | None:
    """OUT's training.json where it is the export of the checkpoint at `step` in this --work;
    None where OUT holds none, or an earlier drafter (an interrupt after the last step's
    checkpoint and before its export, or a run grown past the one OUT holds)."""
    try:
        done = json.loads((pc.out / "training.json").read_text())
        work = Path(done["pipeline"]["work"]).resolve()  # ./w and /abs/w are one folder
        ours = work == pc.work.resolve() and done["stages"]["train"]["steps"] == step
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return done if ours else None


def check_same_data(pc: PipelineConfig, done: dict, step: int) -> None:
    """A finished run asked for other data (added, or another set) at the same --steps: its
    answers are ready in --work, but nothing is left to train on them."""
    was, now = done["pipeline"], pipeline_record(pc)
    if any(f not in was for f in DATA_FIELDS):  # an older version's record: not comparable
        return
    if _data_key(was) != _data_key(now):
        before = ", ".join(
            f"--{f.replace('_', '-')} {was[f]}" for f in DATA_FIELDS if was[f] != now[f]
        )
        raise DFlash2Error(
            f"{pc.out} is already trained to step {step} (the --steps asked) on other data "
            f"({before}); this run's data is ready in {pc.work}: raise --steps to train on it "
            f"(the run resumes from step {step})"
        )


def _data_key(fields: dict) -> tuple:
    """What a run trains on, however it was spelled: each prompt set (a file as its resolved
    path) with its temperatures in order, the corpus and how much of it."""
    try:
        parts = prompt_parts(str(fields["prompts"]), tuple(fields["temperatures"]))
    except DFlash2Error:
        parts = [(fields["prompts"], tuple(fields["temperatures"]))]
    sets = sorted((_path(name), tuple(sorted(temps))) for name, temps in parts)
    return sets, _path(fields["corpus"]), fields["corpus_tokens"]


def _path(name):
    """A file or folder as its resolved path; a split's name (or None) as it is."""
    return str(Path(name).resolve()) if name and Path(name).exists() else name
