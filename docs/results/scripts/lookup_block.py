"""Lookup rounds with their own length (GenerationParams.lookup_block) on the embedded SmolLM2
pair, greedy, drafter block 4: before (lookup proposals cut to the drafter's block, L = 4) vs
after (L = 16, the default; and 32), plain mlx-lm as the speed baseline, all in one process,
interleaved per prompt and repeat. Prompts that quote what the answer repeats: a long document
to summarize, code to edit, text to correct (stdlib files, so any machine has them). Also the
verify cost curve and what `choose_lookup_block` picks from the L = 32 lookup rounds.
Usage: nice -n 10 python lookup_block.py OUT.json [--repeats N] [--max-tokens N]"""

import argparse
import inspect
import json
import statistics
import sys
import textwrap
import time
from pathlib import Path

import dflash2_mlx as d2
from dflash2_mlx import autotune as A
from dflash2_mlx import bench as B
from dflash2_mlx import bench_env
from dflash2_mlx.embedded import ensure_smollm2
from dflash2_mlx.registry import EMBEDDED_DRAFTER
from dflash2_mlx.text import chat_prompt_ids

BLOCK = 4
LOOKUP_BLOCKS = (4, 16, 32)  # 4: before (cut to the drafter's block)


def prompts(tokenizer, doc_tokens: int):
    license_text = (
        Path(sys.base_prefix) / "lib" / f"python{sys.version_info.major}."
        f"{sys.version_info.minor}" / "LICENSE.txt"
    ).read_text()
    doc = tokenizer.decode(tokenizer.encode(license_text, add_special_tokens=False)[:doc_tokens])
    code = inspect.getsource(textwrap.TextWrapper._wrap_chunks)
    prose = textwrap.dedent(inspect.getsource(inspect).split('"""')[1])
    return [
        ("summarize", f"Summarize this document in a few paragraphs:\n\n{doc}"),
        ("code-edit", f"Add type hints to this method and return the whole code:\n\n{code}"),
        ("text-edit", f"Correct any mistakes in this text and return it in full:\n\n{prose}"),
    ]


def measure(pair, args):
    """Per prompt: plain and each lookup block, interleaved; and the L = 32 lookup rounds."""
    rows, lookup_rounds = [], []
    cases = [
        (name, chat_prompt_ids(pair.tokenizer, [{"role": "user", "content": text}]))
        for name, text in prompts(pair.tokenizer, args.doc_tokens)
    ]
    B.plain_decode(pair, cases[0][1], 16)  # warm-up
    for L in LOOKUP_BLOCKS:
        B.dflash2_decode(pair, cases[0][1], 16, BLOCK, L)
    for name, ids in cases:
        plain, runs = [], {L: [] for L in LOOKUP_BLOCKS}
        for _ in range(args.repeats):
            plain.append(B.plain_decode(pair, ids, args.max_tokens))
            for L in LOOKUP_BLOCKS:
                runs[L].append(B.dflash2_decode(pair, ids, args.max_tokens, BLOCK, L))
        plain_tps = statistics.median(t.tps for t in plain)
        row = {
            "prompt": name,
            "prompt_tokens": len(ids),
            "tokens": len(plain[0].tokens),
            "plain_tps": round(plain_tps, 3),
        }
        for L, rs in runs.items():
            st = rs[-1].stats
            tps = statistics.median(t.tps for t in rs)
            row[f"lookup_block {L}"] = {
                "identical": all(t.tokens == p.tokens for t, p in zip(rs, plain)),
                "tau": round(st.tau, 3),
                "rounds": st.rounds,
                "lookup_rounds": st.lookup_rounds,
                "lookup_tau": round(st.lookup_tau, 3),
                "longest_round": st.longest_round,
                "tps": round(tps, 3),
                "speedup": round(tps / plain_tps, 3),
            }
        rows.append(row)
        print(json.dumps(row), flush=True)
        # The L = 32 arm's lookup rounds, replayed by the autotuner's rule below.
        params = d2.GenerationParams(
            max_tokens=args.max_tokens, block_size=BLOCK, lookup_block=max(LOOKUP_BLOCKS)
        )
        lookup_rounds += [
            (ev.drafted, ev.accepted)
            for ev in pair.stream(ids, params)
            if ev.source == "lookup" and ev.finish_reason is None
        ]
    return rows, lookup_rounds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--doc-tokens", type=int, default=3000)
    args = ap.parse_args()
    pair = d2.load_pair(ensure_smollm2(), EMBEDDED_DRAFTER)
    rows, lookup_rounds = measure(pair, args)
    widths = sorted(set(range(1, BLOCK + 1)) | set(A.LOOKUP_WIDTHS))
    vc = B.verify_costs(pair, widths, context=1024)
    choice = A.choose_lookup_block(vc["ms"], lookup_rounds, widths[1:])
    summary = {}
    for L in LOOKUP_BLOCKS:
        arm = [r[f"lookup_block {L}"] for r in rows]
        summary[f"lookup_block {L}"] = {
            "all_identical": all(a["identical"] for a in arm),
            "median_speedup": round(statistics.median(a["speedup"] for a in arm), 3),
            "tau": [a["tau"] for a in arm],
            "speedup": [a["speedup"] for a in arm],
        }
    env = bench_env.environment()
    res = {
        "what": f"Greedy (T=0) chat requests that quote what the answer repeats, on the "
        f"embedded SmolLM2-135M pair (shipped drafter, context lookup 3), drafter "
        f"block {BLOCK}; lookup rounds cut at lookup_block L (4 = before: the "
        f"drafter's block). Speed: tokens after the first over wall time, median of "
        f"{args.repeats} repeats, plain mlx-lm interleaved as the baseline.",
        "command": "nice -n 10 python docs/results/scripts/lookup_block.py "
        + " ".join(sys.argv[1:]),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "chip": env["chip"],
            "blas": env["blas"],
            "blas_threads": env["blas_threads"],
            "mlx": env["mlx"],
            "device": env["device"],
        },
        "max_tokens": args.max_tokens,
        "summary": summary,
        "rows": rows,
        "verify_cost_ms": {"context": vc["context"], "ms": vc["ms"]},
        "autotune_lookup_choice": choice.as_dict(),
    }
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
