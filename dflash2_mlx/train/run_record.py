"""What a run records and how a rerun reads it: training.json in its drafter folder (is it this
checkpoint's export?) and data.json beside its checkpoint (the data its steps trained on)."""

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


def other_data(pc: PipelineConfig, run: Path, step: int) -> str | None:
    """Why a finished checkpoint cannot serve this run: it was trained on other data (added,
    or another set) and nothing is left to train at the same --steps, though this run's
    answers are ready in --work. None: the same data, or a run made before it was noted."""
    try:
        trained_on = json.loads((run / TRAINED_ON).read_text())
    except (OSError, ValueError):
        return None
    if trained_on == data_key(pc):
        return None
    return (
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


def resume_run(pc: PipelineConfig, steps: int, fixed, trainer, run: Path, log) -> dict | None:
    """`trainer` resumes `run`'s checkpoint if there is one (`fixed`: the corpus stream, or
    None). Returns OUT's record where the checkpoint is finished and exported there (nothing
    to do), else None (train, then export). A finished checkpoint asked for other data is
    refused; any other run notes the data it trains on."""
    resumed = trainer.try_resume()
    finished = resumed and trainer.step >= steps
    refused = other_data(pc, run, trainer.step) if finished else None
    done = exported_record(pc, trainer.step) if finished and not refused else None
    if (refused or done is not None) and fixed is not None:
        fixed.close()  # nothing will be trained
    if refused:
        raise DFlash2Error(refused)
    if not finished:
        note_data(pc, run)
    if resumed:
        log(f"resumed at step {trainer.step}")
        if done is not None:
            log(f"{pc.out} is already trained to step {trainer.step}: nothing to do")
    elif (pc.out / "training.json").exists():  # a new run (another --work, other settings)
        log(f"{pc.out} holds a drafter trained before: this run replaces it when it ends")
    return done
