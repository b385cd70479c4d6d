"""The autotuned block by context length on long conversations: plain mlx-lm vs dflash2 at the
profile's block for every context (before) vs dflash2 with the profile's block_by_context
(after), greedy, one process, arms interleaved per case, outputs compared.

A case: a chat history of held-out questions with the target's own greedy answers
(data/smollm2/regen_heldout.jsonl), grown turn by turn to about N tokens, then one unseen
question (docs/results/prompts-unseen24.jsonl). Speed: tokens after the first over wall time.
The schedule is read from this machine's autotune profile (`dflash2 bench --autotune`;
DFLASH2_HOME picks the cache), or given with --schedule "1024:3,2048:2".
Usage: python long_context_block.py OUT.json [--contexts 1000,2000,3500] [--questions 4]"""

import argparse
import json
import statistics
from pathlib import Path

import dflash2_mlx as d2
from dflash2_mlx import bench as B
from dflash2_mlx import bench_env
from dflash2_mlx.embedded import ensure_smollm2
from dflash2_mlx.profiles import (
    recommended_block,
    recommended_block_by_context,
    recommended_lookup_block,
)
from dflash2_mlx.registry import EMBEDDED_DRAFTER
from dflash2_mlx.text import chat_prompt_ids

ROOT = Path(__file__).resolve().parents[3]


def histories(tokenizer, contexts):
    """Per target context: a message list of held-out turns reaching about that many tokens."""
    turns = []
    for line in (ROOT / "data/smollm2/regen_heldout.jsonl").read_text().splitlines():
        r = json.loads(line)
        text = tokenizer.decode(r["prompt_ids"])
        question = text.split("<|im_start|>user\n")[-1].split("<|im_end|>")[0]
        answer = tokenizer.decode([t for t in r["response_ids"] if t not in (2,)])
        turns.append(
            [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        )
    out = {}
    for target in contexts:
        messages = []
        for t in turns:
            if messages and len(chat_prompt_ids(tokenizer, messages)) >= target:
                break
            messages += t
        out[target] = messages
    return out


def questions(n):
    rows = [
        json.loads(x)
        for x in (ROOT / "docs/results/prompts-unseen24.jsonl").read_text().splitlines()
    ]
    by_cat = {}
    for r in rows:
        by_cat.setdefault(r["category"], []).append(r)
    picked = []
    while len(picked) < n:
        for cat in sorted(by_cat):
            if by_cat[cat] and len(picked) < n:
                picked.append(by_cat[cat].pop(0))
    return picked


def seconds(rows, arm):
    return sum(r["tokens"] / r[arm]["tps"] for r in rows)


def arm_numbers(t, plain) -> dict:
    """One dflash2 arm's numbers in a case's row (`t`, `plain`: bench.Timed runs)."""
    s = t.stats.as_dict()
    return {
        "identical": t.tokens == plain.tokens,
        "tps": round(t.tps, 3),
        "speedup": round(t.tps / plain.tps, 3),
        "tau": round(t.stats.tau, 3),
        "rounds": t.stats.rounds,
        "lookup_rounds": s.get("lookup_rounds"),
        "datastore_rounds": s.get("datastore_rounds"),
    }


def interleaved(pair, cases, max_tokens: int, arms) -> list[dict]:
    """An A/B's rows: per case (group, id, prompt ids), plain mlx-lm, then the two arms
    (name, run(ids) -> bench.Timed) in alternating order."""
    rows = []
    for i, (group, pid, ids) in enumerate(cases):
        plain = B.plain_decode(pair, ids, max_tokens)
        row = {"group": group, "prompt": pid, "prompt_tokens": len(ids)}
        row.update(tokens=len(plain.tokens), plain_tps=round(plain.tps, 3))
        for name, run in arms if i % 2 == 0 else arms[::-1]:
            row[name] = arm_numbers(run(ids), plain)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def summarize(rows, key: str, arms: tuple[str, str]) -> dict:
    """Per value of row[key]: each arm's median speedup and all tokens over all time, the
    second arm's over the first's."""
    a, b = arms
    out = {}
    for group in dict.fromkeys(r[key] for r in rows):
        rs = [r for r in rows if r[key] == group]
        out[str(group)] = {
            "prompt_tokens": [r["prompt_tokens"] for r in rs],
            **{
                f"{arm}_speedup_median": round(statistics.median(r[arm]["speedup"] for r in rs), 3)
                for arm in arms
            },
            f"{b}_over_{a}_total": round(seconds(rs, a) / seconds(rs, b), 3),
        }
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--contexts", default="1000,2000,3500")
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--schedule", default=None, help='e.g. "1024:3,2048:2" (default: the profile)')
    args = ap.parse_args()
    pair, block, lookup_block, schedule = profiled_pair()
    if args.schedule:
        schedule = tuple(tuple(int(v) for v in p.split(":")) for p in args.schedule.split(","))
    print(f"block {block}, lookup block {lookup_block}, block_by_context {schedule}", flush=True)
    contexts = [int(c) for c in args.contexts.split(",")]
    hist = histories(pair.tokenizer, contexts)
    cases = []
    for c in contexts:
        for q in questions(args.questions):
            ids = chat_prompt_ids(pair.tokenizer, hist[c] + q["messages"])
            cases.append((c, q["id"], ids))
    B.plain_decode(pair, cases[0][2], 8)  # warm-up
    B.dflash2_decode(pair, cases[0][2], 8, block, lookup_block, schedule)
    rows = []
    for c, qid, ids in cases:
        plain = B.plain_decode(pair, ids, args.max_tokens)
        fixed = B.dflash2_decode(pair, ids, args.max_tokens, block, lookup_block)
        sched = B.dflash2_decode(pair, ids, args.max_tokens, block, lookup_block, schedule)
        row = {
            "context": c,
            "question": qid,
            "prompt_tokens": len(ids),
            "tokens": len(plain.tokens),
            "plain_tps": round(plain.tps, 3),
        }
        for name, t in (("fixed", fixed), ("scheduled", sched)):
            row[name] = arm_numbers(t, plain)
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = summarize(rows, "context", ("fixed", "scheduled"))
    what = (
        "Long conversations (held-out turns with the target's own greedy answers, then "
        "an unseen question), greedy, embedded SmolLM2-135M pair: plain mlx-lm vs dflash2 at the "
        "profile's block at every context (fixed) vs with the profile's block_by_context "
        "(scheduled); speed = tokens after the first / wall time; arms interleaved per case."
    )
    write_record(
        args,
        "long_context_block.py",
        what,
        (block, lookup_block, schedule),
        rows,
        summary,
        ("fixed", "scheduled"),
    )


def profiled_pair():
    """The embedded pair and this machine's profile: (pair, block, lookup block, schedule)."""
    target = ensure_smollm2()
    pair = d2.load_pair(target, EMBEDDED_DRAFTER)
    block = recommended_block(pair, str(target), str(EMBEDDED_DRAFTER)) or 4
    lookup_block = recommended_lookup_block(pair, str(target), str(EMBEDDED_DRAFTER))
    schedule = recommended_block_by_context(pair, str(target), str(EMBEDDED_DRAFTER))
    return pair, block, lookup_block, schedule


def write_record(args, script, what, drafting, rows, summary, arms):
    """The result JSON of a long-context A/B (`arms`: the two dflash2 arms' names)."""
    block, lookup_block, schedule = drafting
    res = {
        "what": what,
        "command": f"python docs/results/scripts/{script} OUT "
        f"--contexts {args.contexts} --questions {args.questions} --max-tokens {args.max_tokens}",
        "environment": bench_env.environment(),
        "block": block,
        "lookup_block": lookup_block,
        "block_by_context": [list(p) for p in schedule],
        "all_identical": all(r[a]["identical"] for r in rows for a in arms),
        "summary": summary,
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
