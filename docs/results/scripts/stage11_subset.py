"""Stage 11's data (the SmolLM2 drafter's model card): every regeneration stage 9 never saw
(train-broad at T=0, the last 257 of train-wide at T=0.7, the 623 of train-deep at T=0.7)
plus 1,867 of stage 9's 5,883 drawn at random (seed 0) — 4,047 sequences, because 400 steps
x 8 sequences draw fewer than all 7,440 and caching features for sequences never drawn wastes
CPU hours. Writes three prompt files for `dflash2 train --prompts` (an id may sit in one set
only, so ids wanted at T=0, at T=0.7 or at both go in separate files):

    python docs/results/scripts/stage11_subset.py OUT_DIR
    dflash2 train smollm2-135m ... --prompts OUT_DIR/only0.jsonl@0+OUT_DIR/only07.jsonl@0.7+OUT_DIR/both.jsonl@0,0.7
"""

import json
import random
import sys
from collections import defaultdict
from pathlib import Path

DATA, PROMPTS = Path("data/smollm2"), Path("dflash2_mlx/assets/prompts")
STAGE9_FILES = (
    "regen_train.jsonl",
    "regen_train-t07.jsonl",
    "regen_train-extra.jsonl",
    "regen_train-more.jsonl",
    "regen_extra-more-t07.jsonl",
    "regen_train-wide.jsonl",
    "regen_train-deep.jsonl",
)
WIDE_T07_SEEN = 447  # regen_train-wide-t07.jsonl's first 447 records existed at stage 9


def keys(name: str) -> list[tuple[str, float]]:
    return [(r["id"], r["temperature"]) for r in map(json.loads, open(DATA / name))]


def stage11_keys() -> list[tuple[str, float]]:
    wide07 = keys("regen_train-wide-t07.jsonl")
    old = [k for f in STAGE9_FILES for k in keys(f)] + wide07[:WIDE_T07_SEEN]
    new = keys("regen_train-broad.jsonl") + wide07[WIDE_T07_SEEN:]
    new += keys("regen_train-deep-t07-partial.jsonl")
    random.seed(0)
    return new + random.sample(old, 1867)


def prompt_lines(*extra: Path) -> dict[str, str]:
    """Each bundled training prompt's JSONL line (and those of `extra` files), by id."""
    return {
        json.loads(line)["id"]: line.rstrip("\n")
        for f in [*PROMPTS.glob("train*.jsonl"), *extra]
        for line in open(f)
        if line.strip()
    }


def write_prompt_files(chosen: list[tuple[str, float]], out: Path) -> None:
    """Three prompt files: ids wanted at T=0 only, at T=0.7 only, at both."""
    temps = defaultdict(set)
    for pid, t in chosen:
        temps[pid].add(t)
    prompts = prompt_lines()
    groups = defaultdict(list)
    for pid, ts in sorted(temps.items()):
        groups["both" if len(ts) == 2 else "only0" if 0.0 in ts else "only07"].append(pid)
    out.mkdir(parents=True, exist_ok=True)
    for name, ids in groups.items():
        (out / f"{name}.jsonl").write_text("".join(prompts[i] + "\n" for i in ids))
    print({name: len(ids) for name, ids in groups.items()}, sum(map(len, temps.values())))


if __name__ == "__main__":
    write_prompt_files(stage11_keys(), Path(sys.argv[1]))
