"""What a run records: training.json in its drafter folder (and whether a rerun finds its own
export there), and data.json beside its checkpoint (the data its steps were trained on)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from ..errors import DFlash2Error
from .pipeline_config import PipelineConfig, prompt_parts

TRAINED_ON = "data.json"  # in the checkpoint's folder: what its steps were trained on


def pipeline_record(pc: PipelineConfig) -> dict:
    """`pc` as training.json records it (plain JSON values; folders resolved)."""
    fields = {k: str(v.resolve()) if isinstance(v, Path) else v for k, v in asdict(pc).items()}
    return json.loads(json.dumps(fields, default=str))


def exported_record(pc: PipelineConfig, step: int) -> dict | None:
    """OUT's training.json where it is the export of the checkpoint at `step` in this --work;
    None where OUT holds none, or an earlier drafter (an interrupt after the last step's
    checkpoint and before its export, or a run grown past the one OUT holds)."""
    try:
        done = json.loads((pc.out / "training.json").read_text())
        work = Path(done["pipeline"]["work"]).resolve()  # an older record's may be relative
        ours = work == pc.work.resolve() and done["stages"]["train"]["steps"] == step
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return done if ours else None


def note_data(pc: PipelineConfig, run: Path) -> None:
    """Beside the checkpoint: the data its next steps train on (a resumed run may add data)."""
    (run / TRAINED_ON).write_text(json.dumps(data_key(pc)))


def check_same_data(pc: PipelineConfig, run: Path, step: int) -> None:
    """A finished checkpoint asked for other data (added, or another set) at the same --steps:
    this run's answers are ready in --work, but nothing is left to train on them. A run made
    before the data was noted is not checked."""
    try:
        trained_on = json.loads((run / TRAINED_ON).read_text())
    except (OSError, ValueError):
        return
    if trained_on != data_key(pc):
        raise DFlash2Error(
            f"{run} is already trained to step {step} (the --steps asked) on other data than "
            f"--prompts {pc.prompts} (see {run / TRAINED_ON}); this run's data is ready in "
            f"{pc.work}: raise --steps to train on it (the run resumes from step {step})"
        )


def data_key(pc: PipelineConfig) -> dict:
    """What a run trains on, however it was spelled: each prompt set (a file as its resolved
    path) with its temperatures, the corpus and how much of it."""
    sets = sorted(
        [_path(name), sorted(set(temps))]
        for name, temps in prompt_parts(pc.prompts, pc.temperatures)
    )
    corpus = _path(pc.corpus)
    return {
        "prompt_sets": sets,
        "corpus": corpus,
        "corpus_tokens": pc.corpus_tokens if corpus else None,
    }


def _path(name):
    """A file or folder as its resolved path; a split's name (or None) as it is."""
    return str(Path(name).resolve()) if name and Path(name).exists() else name
