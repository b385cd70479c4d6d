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
import time
from pathlib import Path

CHUNK = 256  # prompts a BatchGenerator is given at a time


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
    from dflash2_mlx.train import regenerate as rg
    from mlx_lm import load

    records = _greedy_only(args.work, set(args.categories.split(",")))
    done = set()
    if args.out.exists():
        done = {json.loads(line)["id"] for line in args.out.read_text().splitlines()}
    ids = sorted(records)
    random.Random(args.seed).shuffle(ids)
    ids = [i for i in ids if i not in done]
    print(f"{len(ids)} to answer, {len(done)} done", flush=True)
    net, tokenizer = load(str(ensure_smollm2()))
    stats = rg.RegenStats()
    with open(args.out, "a", encoding="utf-8") as fh:
        for c in range(0, len(ids), CHUNK):
            chunk = [records[i] for i in ids[c : c + CHUNK]]
            encoded = {r["id"]: r["prompt_ids"] for r in chunk}
            prompts = [Prompt(r["id"], r["category"], []) for r in chunk]
            prompts.sort(key=lambda p: len(encoded[p.id]))  # similar lengths prefill together
            gen = rg._batch_generator(
                net, tokenizer, args.temperature, args.top_p, args.seed + c, 256, args.batch_size
            )
            uids = gen.insert([encoded[p.id] for p in prompts], [256] * len(prompts))
            progress = rg._Progress(lambda s: print(s, flush=True), start=time.perf_counter())
            progress.begin(args.temperature, len(prompts), c + len(done))
            try:
                rg._write_finished(
                    gen,
                    dict(zip(uids, prompts)),
                    encoded,
                    args.temperature,
                    fh,
                    stats,
                    progress,
                    args.batch_size,
                )
            finally:
                gen.close()


if __name__ == "__main__":
    main()
