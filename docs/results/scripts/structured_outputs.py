"""Structured outputs on the embedded SmolLM2 pair: replies held to a JSON schema (grammar.py,
llguidance), plain constrained decoding vs speculative constrained decoding, with and without
the grammar's forced text as drafts. Greedy; every arm must give the same tokens, and every
finished reply must parse as JSON. Arms interleaved per prompt, in one process.
Usage: python structured_outputs.py OUT.json [--block 4] [--max-tokens 160]"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import dflash2_mlx as d2
from dflash2_mlx import bench_env
from dflash2_mlx.embedded import ensure_smollm2
from dflash2_mlx.registry import EMBEDDED_DRAFTER
from dflash2_mlx.text import chat_prompt_ids

STR, INT, NUM = {"type": "string"}, {"type": "integer"}, {"type": "number"}


def obj(**props):
    return {"type": "object", "properties": props, "required": list(props)}


TASKS = [
    (
        "Extract the person from: 'Maria Lopez, 34, moved to Lisbon last year.' Reply in JSON.",
        obj(name=STR, age=INT, city=STR),
    ),
    (
        "List three fruits and their colors as JSON.",
        obj(fruits={"type": "array", "items": obj(name=STR, color=STR)}),
    ),
    (
        "Give a pancake recipe as JSON: a title and the ingredients.",
        obj(title=STR, ingredients={"type": "array", "items": STR}),
    ),
    (
        "Classify the sentiment of this review: 'The battery died after two days.' Answer in JSON.",
        obj(sentiment={"enum": ["positive", "negative", "neutral"]}, confidence=NUM),
    ),
    (
        "Describe the Python function len as JSON.",
        obj(function_name=STR, arguments={"type": "array", "items": STR}, returns=STR),
    ),
    ("Describe the weather in a city of your choice as a JSON object.", None),
]


class NoForced:
    """A grammar whose forced text is not proposed (the drafter and lookup only)."""

    def __init__(self, grammar):
        self.grammar = grammar

    def __call__(self):
        c = self.grammar()
        c.forced = lambda: []
        return c


def run(pair, ids, params):
    t0 = time.perf_counter()
    out, stats = pair.generate(ids, params)
    return out, stats, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--block", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=160)
    args = ap.parse_args()
    pair = d2.load_pair(ensure_smollm2(), EMBEDDED_DRAFTER)
    rows = []
    for prompt, schema in TASKS:
        ids = chat_prompt_ids(pair.tokenizer, [{"role": "user", "content": prompt}])
        grammar = pair.json_schema(schema)
        base = dict(max_tokens=args.max_tokens, block_size=args.block)
        arms = {
            "plain": d2.GenerationParams(**base, speculative=False, constraint=grammar),
            "speculative": d2.GenerationParams(**base, constraint=grammar),
            "speculative, no forced drafts": d2.GenerationParams(
                **base, constraint=NoForced(grammar)
            ),
            "speculative, free text": d2.GenerationParams(**base),
        }
        run(pair, ids, d2.GenerationParams(max_tokens=4, constraint=grammar))  # warm-up
        res = {name: run(pair, ids, p) for name, p in arms.items()}
        out = res["plain"][0]
        text = pair.tokenizer.decode([t for t in out if t not in pair.eos_ids])
        try:
            json.loads(text)
            parses = True
        except json.JSONDecodeError:
            parses = False
        row = {
            "prompt": prompt,
            "schema": schema,
            "reply": text,
            "finished": out[-1] in pair.eos_ids,
            "parses": parses,
            "identical": all(res[a][0] == out for a in arms if a != "speculative, free text"),
            "arms": {
                name: {
                    "tokens": len(o),
                    "seconds": round(s, 3),
                    "decode_tps": round(st.decode_tps, 2),
                    "tau": round(st.tau, 3),
                    "rounds": st.rounds,
                }
                for name, (o, st, s) in res.items()
            },
        }
        rows.append(row)
        print(
            json.dumps({k: row[k] for k in ("finished", "parses", "identical")}),
            {n: (a["tau"], a["decode_tps"]) for n, a in row["arms"].items()},
            flush=True,
        )
    speed = {
        name: round(
            statistics.median(
                r["arms"][name]["decode_tps"] / r["arms"]["plain"]["decode_tps"] for r in rows
            ),
            3,
        )
        for name in rows[0]["arms"]
    }
    env = bench_env.environment()
    Path(args.out).write_text(
        json.dumps(
            {
                "what": "JSON-schema replies on the embedded SmolLM2 pair (shipped drafter, lookup 3, "
                "datastore on), greedy: plain constrained decoding vs speculative constrained decoding "
                "(with and without the grammar's forced text as drafts), and the same prompt "
                "unconstrained for reference. decode tok/s after the first token.",
                "command": "python docs/results/scripts/structured_outputs.py "
                + " ".join(sys.argv[1:]),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "machine": {k: env[k] for k in ("chip", "blas", "blas_threads", "mlx", "device")},
                "block": args.block,
                "max_tokens": args.max_tokens,
                "median_decode_speedup_vs_plain": speed,
                "all_identical": all(r["identical"] for r in rows),
                "tasks": rows,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
