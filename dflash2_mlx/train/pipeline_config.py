"""What `dflash2 train` runs on: the pipeline's paths, data and regeneration settings, and
the prompt spec's per-split temperatures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import ParameterError
from ..prompts import prompt_path


@dataclass
class PipelineConfig:
    target: str  # mlx-lm folder or repo id
    out: Path  # drafter folder to write
    work: Path  # regenerations, features, checkpoints
    prompts: str = (
        "train+train-wide+train-deep+train-extra+train-more"  # splits or JSONL, '+'-joined
    )
    heldout: str = "heldout"
    max_new_tokens: int = 256
    temperatures: tuple[float, ...] = (0.0, 0.7)
    regen_batch: int = 32
    max_len: int = 512
    skip_bad_lines: bool = False
    dtype: str = "bfloat16"
    corpus: str | None = None  # `dflash2 corpus` folder or JSONL files: fixed text (streamed)
    corpus_tokens: int = 2_000_000  # tokens of the corpus to stream (shuffled, then cut)
    stream_disk_bytes: int = 2_000_000_000  # features of fixed text on disk at once
    stream_passes: float = 2.0  # draws per sequence of a shard before the next shard
    live_features: bool = False  # regenerations' features computed when a step draws them


def prompt_parts(spec: str, temperatures: tuple[float, ...]) -> list[tuple[str, tuple[float, ...]]]:
    """'train@0,0.7+train-extra' -> [('train', (0.0, 0.7)), ('train-extra', temperatures)]:
    a split (or JSONL path) may name its own regeneration temperatures."""
    parts = [spec] if Path(spec).exists() else spec.split("+")
    out = []
    for part in parts:
        name, _, suffix = part.rpartition("@")
        try:
            own = tuple(float(t) for t in suffix.split(",")) if name else None
        except ValueError:  # a suffix that is not numbers is part of a file name,
            if prompt_path(name).exists() and not prompt_path(part).exists():  # else a typo
                raise ParameterError(
                    f"--prompts {part!r}: the temperatures after '@' must be numbers "
                    f"(e.g. {name}@0,0.7), got {suffix!r}"
                ) from None
            own = None
        out.append((name, own) if own else (part, temperatures))
    return out
