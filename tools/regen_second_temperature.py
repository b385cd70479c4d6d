"""Sampled answers to training prompts that have only a greedy one, straight from the prompt ids
of their greedy records in a `dflash2 train --work` folder (no prompt file needed).

The prompts of the given categories are taken in a seeded shuffled order and answered in chunks,
so a partial file is a balanced sample; reruns skip the ids already in OUT:

    python tools/stage_work_folder.py W
    python tools/regen_second_temperature.py W OUT.jsonl --categories chat,corpus-chat,multi-turn,summaries
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

CHUNK = 256  # prompts given to one regenerate() call (a partial file stays balanced)


def _greedy_only(work: Path, categories: set[str]) -> dict[str, dict]:
    answered: dict[str, set[float]] = {}
    records: dict[str, dict] = {}
    for line in (work / "regen_train.jsonl").read_text().splitlines():
        r = json.loads(line)
        answered.setdefault(r["id"], set()).add(float(r["temperature"]))
        if r["category"] in categories and float(r["temperature"]) == 0.0:
            records[r["id"]] = r
    return {i: r for i, r in records.items() if answered[i] == {0.0}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("work", type=Path, help="a work folder from tools/stage_work_folder.py")
    ap.add_argument("out", type=Path)
    ap.add_argument("--categories", default="chat,corpus-chat,multi-turn,summaries")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seed", type=int, default=31)
    args = ap.parse_args()

    from dflash2_mlx.embedded import ensure_smollm2  # before mlx_lm: it binds the BLAS
    from dflash2_mlx.prompts import Prompt
    from dflash2_mlx.train.regenerate import regenerate
    from mlx_lm import load

    records = _greedy_only(args.work, set(args.categories.split(",")))
    ids = sorted(records)
    random.Random(args.seed).shuffle(ids)
    model = load(str(ensure_smollm2()))
    for c in range(0, len(ids), CHUNK):  # each chunk's done prompts are skipped by regenerate
        chunk = [records[i] for i in ids[c : c + CHUNK]]
        regenerate(
            model,
            [Prompt(r["id"], r["category"], []) for r in chunk],
            args.out,
            temperatures=(args.temperature,),
            top_p=args.top_p,
            batch_size=args.batch_size,
            seed=args.seed + c,
            prompt_ids={r["id"]: r["prompt_ids"] for r in chunk},
        )


if __name__ == "__main__":
    main()
