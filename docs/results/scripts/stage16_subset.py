"""Stage 16's data (the SmolLM2 drafter's model card): stage 15's 7,225 sequences (their
features already cached) plus the T=0.5 answers to the bundled training prompts that existed
when the stage began (`regen_train-broad-t05.jsonl`, then `regen_train-rest-t05-partial.jsonl`
in file order: its first 1,557). An id may sit in one prompt set only, so there is one file per set of wanted
temperatures; the script prints the `--prompts` spec:

    python docs/results/scripts/stage16_subset.py OUT_DIR chat.jsonl
    dflash2 train smollm2-135m ... --prompts SPEC
"""

import sys
from collections import defaultdict
from pathlib import Path

from stage11_subset import keys, prompt_lines
from stage13_subset import stage13_keys
from stage15_subset import CHAT_FILES, CHAT_SEEN

T05_FILES = ("regen_train-broad-t05.jsonl", "regen_train-rest-t05-partial.jsonl")
T05_SEEN = 1300 + 1557

if __name__ == "__main__":
    out, chat_prompts = Path(sys.argv[1]), Path(sys.argv[2])
    chat = [k for f in CHAT_FILES for k in keys(f)][:CHAT_SEEN]
    chosen = stage13_keys() + chat + [k for f in T05_FILES for k in keys(f)][:T05_SEEN]
    assert len(set(chosen)) == len(chosen), "a sequence listed twice"
    temps = defaultdict(set)
    for pid, t in chosen:
        temps[pid].add(t)
    lines = prompt_lines(chat_prompts)
    groups = defaultdict(list)
    for pid, ts in sorted(temps.items()):
        groups[",".join(f"{t:g}" for t in sorted(ts))].append(pid)
    out.mkdir(parents=True, exist_ok=True)
    spec = []
    for ts, ids in sorted(groups.items()):
        path = out / f"t{ts.replace(',', '_')}.jsonl"
        path.write_text("".join(lines[i] + "\n" for i in ids))
        spec.append(f"{path}@{ts}")
        print(ts, len(ids))
    print(len(chosen), "sequences;", "--prompts", "+".join(spec))
