"""Predicted Outputs on the embedded SmolLM2 pair, greedy, with and without the prediction:
code-edit requests whose prediction is the code they quote, and questions whose prediction is
the answer to a paraphrase -> smollm2-prediction.json.
Usage: python prediction_tau.py OUT.json [--max-tokens 160]  (tokens per round are
load-independent)."""

import argparse
import json

import dflash2_mlx as d2
from dflash2_mlx.embedded import ensure_smollm2
from dflash2_mlx.registry import EMBEDDED_DRAFTER
from dflash2_mlx.text import chat_prompt_ids

CODE = [
    "def total_price(items, tax):\n    subtotal = 0\n    for item in items:\n        subtotal += item['price'] * item['qty']\n    return subtotal * (1 + tax)\n",
    "function countWords(text) {\n  const words = text.trim().split(/\\s+/);\n  const counts = {};\n  for (const w of words) {\n    counts[w] = (counts[w] || 0) + 1;\n  }\n  return counts;\n}\n",
    "def is_palindrome(s):\n    cleaned = ''.join(c.lower() for c in s if c.isalnum())\n    return cleaned == cleaned[::-1]\n\n\ndef longest_palindrome(words):\n    best = ''\n    for w in words:\n        if is_palindrome(w) and len(w) > len(best):\n            best = w\n    return best\n",
    "SELECT customers.name, COUNT(orders.id) AS order_count\nFROM customers\nJOIN orders ON orders.customer_id = customers.id\nWHERE orders.created_at >= '2024-01-01'\nGROUP BY customers.name\nORDER BY order_count DESC;\n",
]
# The predicted text is not in the prompt: the prediction is the model's answer to a paraphrase
# (an editor re-asking, a regenerated reply).
PARA = [
    (
        "Explain what a hash table is in three sentences.",
        "In three sentences, explain what a hash table is.",
    ),
    ("Give me four tips for sleeping better.", "What are four tips for better sleep?"),
]
ASK = [
    "Add a docstring to this function and return the code:\n\n",
    "Rewrite this code using const instead of let where possible and return it:\n\n",
    "Add type hints to this code and return it:\n\n",
    "Format this SQL query nicely and return it:\n\n",
]


def main(out_path, max_tokens=160):
    pair = d2.load_pair(ensure_smollm2(), EMBEDDED_DRAFTER)
    rows = []
    cases = [
        (ask + code, tuple(pair.tokenizer.encode(code, add_special_tokens=False)))
        for code, ask in zip(CODE, ASK)
    ]
    for ask, para in PARA:
        ids = chat_prompt_ids(pair.tokenizer, [{"role": "user", "content": para}])
        cases.append(
            (ask, tuple(pair.generate(ids, d2.GenerationParams(max_tokens=max_tokens))[0]))
        )
    for request, pred in cases:
        ids = chat_prompt_ids(pair.tokenizer, [{"role": "user", "content": request}])
        row = {"request": request.split("\n")[0], "prediction_tokens": len(pred)}
        outs = {}
        for name, p in (("no prediction", ()), ("prediction", pred)):
            for block in (4, 8):
                params = d2.GenerationParams(max_tokens=max_tokens, block_size=block, prediction=p)
                out, st = pair.generate(ids, params)
                outs[(name, block)] = out
                row[f"{name}, block {block}"] = {
                    "tau": round(st.tau, 3),
                    "rounds": st.rounds,
                    "tokens": st.committed,
                    "prediction_accepted": st.prediction_accepted,
                    "prediction_rejected": st.prediction_drafted - st.prediction_accepted,
                    "lookup_rounds": st.lookup_rounds,
                }
        row["outputs_identical"] = len({tuple(o) for o in outs.values()}) == 1
        rows.append(row)
        print(json.dumps(row), flush=True)
    res = {
        "what": "Greedy (T=0) chat requests on the embedded SmolLM2-135M pair (shipped drafter, "
        "context lookup 3 on in both arms), max 160 tokens. Code edits: the prediction "
        "is the code quoted in the request, as an editor sends it. Questions: the "
        "prediction is the model's own answer to a paraphrase of the question (text "
        "the prompt does not hold). tau = tokens per round.",
        "script": "docs/results/scripts/prediction_tau.py",
        "rows": rows,
    }
    json.dump(res, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--max-tokens", type=int, default=160)
    args = ap.parse_args()
    main(args.out, args.max_tokens)
