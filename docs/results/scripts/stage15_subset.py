"""Stage 15's data (the SmolLM2 drafter's model card): stage 13's 5,794 sequences (their
features already cached) plus the first 1,431 greedy answers to chitchat first user turns
(`regen_corpus-chat-partial.jsonl`, then `-rest`, in file order: those that existed when the
stage began). The chitchat prompts are not bundled: pass the file `corpus_prompts` derived them
into (see data/smollm2/README.md).

    python docs/results/scripts/stage15_subset.py OUT_DIR chat.jsonl
    dflash2 train smollm2-135m ... --prompts OUT_DIR/only0.jsonl@0+OUT_DIR/only07.jsonl@0.7+OUT_DIR/both.jsonl@0,0.7+OUT_DIR/chat.jsonl@0
"""

import json
import sys
from pathlib import Path

from stage11_subset import keys, write_prompt_files
from stage13_subset import stage13_keys

CHAT_FILES = ("regen_corpus-chat-partial.jsonl", "regen_corpus-chat-rest.jsonl")
CHAT_SEEN = 1431

if __name__ == "__main__":
    out, chat_prompts = Path(sys.argv[1]), Path(sys.argv[2])
    write_prompt_files(stage13_keys(), out)
    answered = {pid for pid, _ in [k for f in CHAT_FILES for k in keys(f)][:CHAT_SEEN]}
    lines = [x for x in open(chat_prompts) if x.strip() and json.loads(x)["id"] in answered]
    assert len(lines) == len(answered), "an answered chitchat prompt missing from the file"
    (out / "chat.jsonl").write_text("".join(lines))
    print({"chat": len(lines)})
