"""A `dflash2 train --work` folder holding every training-side regeneration in data/smollm2, so a
stage trains on all of them without regenerating anything.

Writes W/regen_train.jsonl (each (id, temperature) once, first file in name order wins),
W/regen_heldout.jsonl, one placeholder prompt file per set of temperatures an id was answered
at (the trainer reads answers by id and temperature; each placeholder carries the prompt ids
its answers were made for, which a rerun checks), and W/spec.txt,
the `--prompts` value naming them:

    python tools/stage_work_folder.py W
    dflash2 train smollm2-135m --out stageN --work W --prompts "$(cat W/spec.txt)" \\
        --layer-ids 1,8,15,22,29 --steps 400 --lr 0.00015 --live-features \\
        --init-from dflash2_mlx/assets/drafters/smollm2-135m-dflash2
"""

from __future__ import annotations

import json
import shutil
import sys
from collections import defaultdict
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "smollm2"


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    work = Path(sys.argv[1])
    work.mkdir(parents=True, exist_ok=True)
    seen, temps, prompt_ids = set(), defaultdict(set), {}
    with open(work / "regen_train.jsonl", "w") as out:
        for path in sorted(DATA.glob("regen_*.jsonl")):
            if path.name == "regen_heldout.jsonl":
                continue
            for line in path.read_text().splitlines():
                r = json.loads(line)
                key = (r["id"], float(r["temperature"]))
                if key in seen:
                    continue
                seen.add(key)
                temps[r["id"]].add(key[1])
                prompt_ids[r["id"]] = r["prompt_ids"]
                out.write(line + "\n")
    shutil.copy(DATA / "regen_heldout.jsonl", work / "regen_heldout.jsonl")
    groups = defaultdict(list)
    for pid, ts in temps.items():
        groups[tuple(sorted(ts))].append(pid)
    spec = []
    for ts, ids in sorted(groups.items()):
        path = work / ("t" + "_".join(f"{t:g}" for t in ts) + ".jsonl")
        rows = (
            {
                "id": pid,
                "category": "x",
                "messages": [{"role": "user", "content": f"placeholder {pid}"}],
                "prompt_ids": prompt_ids[pid],  # what it was answered for (checked on reuse)
            }
            for pid in ids
        )
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        spec.append(f"{path}@{','.join(f'{t:g}' for t in ts)}")
        print(f"{path.name}: {len(ids)} ids")
    (work / "spec.txt").write_text("+".join(spec))
    print(f"{len(seen)} answers -> {work / 'regen_train.jsonl'}")


if __name__ == "__main__":
    main()
