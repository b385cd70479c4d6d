"""Stage 13's data (the SmolLM2 drafter's model card): stage 11's 4,047 sequences (their
features already cached) plus every regeneration no stage has seen yet — train-deep's other
447 answers at T=0.7 and all 1,300 of train-broad at T=0.7. Same prompt-file layout as
stage11_subset.py:

    python docs/results/scripts/stage13_subset.py OUT_DIR
    dflash2 train smollm2-135m ... --prompts OUT_DIR/only0.jsonl@0+OUT_DIR/only07.jsonl@0.7+OUT_DIR/both.jsonl@0,0.7
"""

import sys
from pathlib import Path

from stage11_subset import keys, stage11_keys, write_prompt_files

NEW_FILES = (
    "regen_train-deep-t07-rest.jsonl",
    "regen_train-broad-t07-partial.jsonl",
    "regen_train-broad-t07-rest.jsonl",
)


def stage13_keys() -> list[tuple[str, float]]:
    chosen = stage11_keys() + [k for f in NEW_FILES for k in keys(f)]
    assert len(set(chosen)) == len(chosen), "a sequence listed twice"
    return chosen


if __name__ == "__main__":
    write_prompt_files(stage13_keys(), Path(sys.argv[1]))
