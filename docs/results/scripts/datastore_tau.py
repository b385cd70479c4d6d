"""The response datastore (engine/datastore.py) on vs off: engine τ and decode speed on the
held-out prompts, greedy, context lookup 3, embedded SmolLM2 pair; arms interleaved per prompt
in one process, outputs compared. The off arm's drafter rounds are also replayed against the
datastore (what it would have proposed there, and how much of it the output confirms) to
compare a datastore match with a drafter pass by matched length. With `--against FILE.npz` the
arms are the shipped datastore vs that file instead (e.g. a rebuilt, larger one); the replay is
then of the shipped arm's drafter rounds against the other file.
Usage: nice -n 10 python datastore_tau.py OUT.json [--limit N] [--max-tokens 256] [--block 8]
  [--against FILE.npz]"""

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import dflash2_mlx as d2
from dflash2_mlx import bench_env
from dflash2_mlx.embedded import ensure_smollm2
from dflash2_mlx.engine.datastore import Datastore
from dflash2_mlx.engine.events import GenerationStats
from dflash2_mlx.prompts import load_prompts
from dflash2_mlx.registry import EMBEDDED_DRAFTER
from dflash2_mlx.text import chat_prompt_ids


def run(pair, ids, params):
    """(tokens, stats, decode seconds, drafter rounds as (context length, accepted))."""
    stats, out, rounds = GenerationStats(), [], []
    t_first = None
    for ev in pair.stream(ids, params):
        t_first = t_first or time.perf_counter()
        if not ev.prefill and ev.source == "drafter" and ev.finish_reason is None:
            rounds.append((len(ids) + len(out), ev.accepted, ev.drafted))
        stats.add(ev)
        out.extend(ev.tokens)
    return out, stats, time.perf_counter() - t_first, rounds


def replay(store, ids, out, rounds, table):
    """At each drafter round of the off arm: the datastore's proposal, the tokens of it the
    output confirms, vs the drafter's accepted count, bucketed by matched context length."""
    full = list(ids) + out
    for ctx_len, accepted, drafted in rounds:
        found = store.match(full[:ctx_len], 7)
        if found is None:
            continue
        truth = full[ctx_len : ctx_len + len(found.tokens)]
        ok = 0
        while ok < len(truth) and truth[ok] == found.tokens[ok]:
            ok += 1
        row = table[min(found.matched, 8)]
        row[0] += 1
        row[1] += accepted
        row[2] += ok


def merge(into: GenerationStats, stats: GenerationStats) -> None:
    """Add one generation's counts and times to a running total."""
    for k, v in vars(stats).items():
        if isinstance(v, (int, float)) and k not in ("last_round", "longest_round"):
            setattr(into, k, getattr(into, k) + v)


def summary(stats: GenerationStats, secs: float) -> dict:
    d = stats.as_dict()
    keep = ("rounds", "committed", "tau", "lookup_rounds", "lookup_tau")
    out = {k: d[k] for k in keep}
    out.update({k: d[k] for k in d if k.startswith("datastore")})
    out["decode_s"] = round(secs, 3)
    out["tokens_per_s"] = round((stats.committed - 1) / secs, 3) if secs > 0 else None
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--limit", type=int, default=None, help="the first N held-out prompts")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--against", type=Path, default=None, help="a datastore .npz vs the shipped")
    args = ap.parse_args()
    pair = d2.load_pair(ensure_smollm2(), EMBEDDED_DRAFTER, datastore=True)
    shipped = pair.decoder.datastore
    if args.against is None:
        stores = {"off": None, "on": shipped}
    else:
        stores = {"shipped": shipped, "new": Datastore.load(args.against, shipped.n)}
    (base, test), store = stores, list(stores.values())[-1]
    held = load_prompts("heldout")
    # Round-robin over the categories, so that a run stopped early still covers them all.
    rank = {p.id: sum(q.category == p.category for q in held[:i]) for i, p in enumerate(held)}
    chosen = sorted(held, key=lambda p: rank[p.id])[: args.limit]
    params = d2.GenerationParams(max_tokens=args.max_tokens, block_size=args.block)
    pair.generate(chat_prompt_ids(pair.tokenizer, chosen[0].messages), params)  # warm-up
    total = {arm: GenerationStats() for arm in stores}
    secs = {arm: 0.0 for arm in stores}
    table = collections.defaultdict(lambda: [0, 0, 0])
    per_prompt, identical = [], 0
    for i, p in enumerate(chosen):
        ids = chat_prompt_ids(pair.tokenizer, p.messages)
        row = {"id": p.id, "category": p.category}
        outs = {}
        for arm in (base, test) if i % 2 == 0 else (test, base):  # ABBA over prompts
            pair.decoder.datastore = stores[arm]
            out, stats, s, rounds = run(pair, ids, params)
            outs[arm] = out
            merge(total[arm], stats)
            secs[arm] += s
            row[arm] = summary(stats, s)
            if arm == base:
                replay(store, ids, out, rounds, table)
        row["identical"] = outs[base] == outs[test]
        identical += row["identical"]
        per_prompt.append(row)
        print(p.id, row[base]["tau"], row[test]["tau"], row["identical"], flush=True)
        write(args, chosen[: i + 1], total, secs, table, per_prompt, identical, stores)


def describe(store):
    return {"tokens": len(store), "min_match": store.n, **store.meta} if store else None


def write(args, chosen, total, secs, table, per_prompt, identical, stores):
    (base, test), store = stores, list(stores.values())[-1]
    env = bench_env.environment()
    arms = {arm: summary(total[arm], secs[arm]) for arm in total}
    res = {
        "what": f"Response datastore arms {base} vs {test} (engine/datastore.py; `datastore`: "
        f"the {test} arm's file, `datastore_shipped`: the drafter's datastore.npz when both arms "
        "use one): greedy, context lookup 3, embedded SmolLM2-135M pair, "
        "held-out prompts, arms interleaved per prompt (ABBA) in one process; τ pooled over "
        "rounds, tokens/s = committed tokens after the first / decode seconds. "
        "`replay_by_match`: every drafter round of the first arm with a match in the second arm's datastore, by "
        "matched context length (8 = 8+): rounds, mean drafter accepted, mean datastore "
        "tokens the output confirms (7 proposed at most).",
        "command": "nice -n 10 python docs/results/scripts/datastore_tau.py "
        + " ".join(sys.argv[1:]),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {k: env[k] for k in ("chip", "blas", "blas_threads", "mlx", "device")},
        "datastore": describe(store),
        **({"datastore_shipped": describe(stores[base])} if base != "off" else {}),
        "block": args.block,
        "max_tokens": args.max_tokens,
        "prompts": len(chosen),
        "identical": identical,
        "arms": arms,
        "tau_gain": round(arms[test]["tau"] / arms[base]["tau"], 4),
        f"speedup_{test}_vs_{base}": round(
            arms[test]["tokens_per_s"] / arms[base]["tokens_per_s"], 4
        ),
        "replay_by_match": {
            str(k): {
                "rounds": n,
                "drafter_accepted": round(a / n, 3),
                "datastore_confirmed": round(c / n, 3),
            }
            for k, (n, a, c) in sorted(table.items())
        },
        "per_prompt": per_prompt,
    }
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
