"""Model-free proposals at long contexts (GenerationParams.verify_cost): a greedy round's
lookup, prediction or datastore proposal cut to what its source's acceptance in the generation
so far pays for at the profile's verify cost there, from block_by_context's first context on
(after), vs never cut (before). Long conversations as in long_context_block.py (held-out turns
with the target's own answers grown to about N tokens, then an unseen chat / code /
instructions question), greedy, one process, arms interleaved per case (order alternating),
outputs compared with plain mlx-lm. Below the schedule's first context the arms are the same
run (the 7 bench prompts are shorter). Speed: tokens after the first / wall time.
Usage: python model_free_cut_ab.py OUT.json [--contexts 2000,3500,5000] [--questions 3]"""

import argparse

from dflash2_mlx import bench as B
from dflash2_mlx.profiles import profile_advice
from dflash2_mlx.embedded import ensure_smollm2
from dflash2_mlx.registry import EMBEDDED_DRAFTER
from dflash2_mlx.text import chat_prompt_ids
from long_context_block import histories, interleaved, profiled_pair, questions, summarize
from long_context_block import write_record


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--contexts", default="2000,3500,5000")
    ap.add_argument("--questions", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    pair, block, lookup_block, schedule = profiled_pair()
    cost = profile_advice(pair, str(ensure_smollm2()), str(EMBEDDED_DRAFTER)).verify_cost
    if cost is None or not schedule:
        raise SystemExit("needs a profile with long-context costs: dflash2 bench --autotune")
    print(f"block {block}, lookup block {lookup_block}, block_by_context {schedule}", flush=True)
    contexts = [int(c) for c in args.contexts.split(",") if c]
    hist = histories(pair.tokenizer, contexts)
    cases = [
        (str(c), q["id"], chat_prompt_ids(pair.tokenizer, hist[c] + q["messages"]))
        for c in contexts
        for q in questions(args.questions)
    ]

    def run(verify_cost, ids):
        return B.dflash2_decode(
            pair, ids, args.max_tokens, block, lookup_block, schedule, verify_cost
        )

    B.plain_decode(pair, cases[0][2], 8)  # warm-up
    arms = [("before", lambda ids: run(None, ids)), ("after", lambda ids: run(cost, ids))]
    rows = interleaved(pair, cases, args.max_tokens, arms)
    summary = summarize(rows, "group", ("before", "after"))
    what = (
        "Model-free proposals cut per generation by their source's acceptance so far at the "
        "profile's verify cost, from block_by_context's first context on (after) vs never "
        "(before); greedy, embedded SmolLM2-135M pair, the profile's block / lookup block / "
        "block_by_context; tokens after the first / wall time; arms interleaved per case."
    )
    drafting = (block, lookup_block, schedule)
    write_record(args, "model_free_cut_ab.py", what, drafting, rows, summary, ("before", "after"))


if __name__ == "__main__":
    main()
