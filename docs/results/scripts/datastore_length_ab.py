"""A datastore round's length, as the engine has it (before: up to 7 tokens, the whole match)
vs cut to the drafter's block at that context less the anchor, then on while the match is
sure (after: DatastoreMatch.sure; the arm's store wraps the shipped one), greedy, one process,
arms interleaved per case, outputs compared with plain mlx-lm. Measured, not shipped: code
loses (docs/results/smollm2-datastore-length.json).

Cases: the 7 bench prompts (short contexts) and long conversations as in
long_context_block.py (held-out turns with the target's own answers grown to about N tokens,
then an unseen question). Both arms run the profile's block, lookup block and
block_by_context (DFLASH2_HOME picks the cache). Speed: tokens after the first / wall time.
Usage: python datastore_length_ab.py OUT.json [--contexts 2000,3500] [--questions 3]"""

import argparse
import copy

from dflash2_mlx import bench as B
from dflash2_mlx.engine.generation import block_at
from dflash2_mlx.prompts import load_prompts
from dflash2_mlx.text import chat_prompt_ids
from long_context_block import histories, interleaved, profiled_pair, questions, summarize
from long_context_block import write_record


class CutStore:
    """The shipped datastore with its proposals cut to the block at their context less the
    anchor, then on while sure."""

    def __init__(self, store, block: int, schedule):
        self.store, self.block, self.schedule = store, block, schedule

    def propose(self, context, length):
        found = self.store.match(context, length)
        if found is None or found.share < self.store.min_share:
            return []
        n = min(block_at(self.block, self.schedule, len(context)) - 1, len(found.tokens))
        while n < len(found.tokens) and found.sure[n]:
            n += 1
        return found.tokens[:n]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--contexts", default="2000,3500")
    ap.add_argument("--questions", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    pair, block, lookup_block, schedule = profiled_pair()
    print(f"block {block}, lookup block {lookup_block}, block_by_context {schedule}", flush=True)
    before = pair.decoder
    after = copy.copy(before)
    after.datastore = CutStore(before.datastore, block, schedule)
    cases = [
        ("bench", p.id, chat_prompt_ids(pair.tokenizer, p.messages))
        for p in B.select_prompts(load_prompts("heldout"), 7)
    ]
    contexts = [int(c) for c in args.contexts.split(",") if c]
    hist = histories(pair.tokenizer, contexts)
    for c in contexts:
        for q in questions(args.questions):
            cases.append(
                (str(c), q["id"], chat_prompt_ids(pair.tokenizer, hist[c] + q["messages"]))
            )

    def run(dec, ids):
        pair.decoder = dec
        return B.dflash2_decode(pair, ids, args.max_tokens, block, lookup_block, schedule)

    B.plain_decode(pair, cases[0][2], 8)  # warm-up
    run(before, cases[0][2])
    arms = [("before", lambda ids: run(before, ids)), ("after", lambda ids: run(after, ids))]
    rows = interleaved(pair, cases, args.max_tokens, arms)
    summary = summarize(rows, "group", ("before", "after"))
    what = (
        "Datastore rounds up to 7 tokens (before) vs cut to the drafter's block at the "
        "context less the anchor, then on while sure (after), greedy, embedded SmolLM2-135M "
        "pair, the profile's block / lookup block / block_by_context; speed = tokens after the "
        "first / wall time; arms interleaved per case (order alternating), outputs compared "
        "with plain mlx-lm."
    )
    write_record(
        args,
        "datastore_length_ab.py",
        what,
        (block, lookup_block, schedule),
        rows,
        summary,
        ("before", "after"),
    )


if __name__ == "__main__":
    main()
