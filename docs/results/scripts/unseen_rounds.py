"""Per-round measurement: plain mlx-lm vs dflash2 configs, interleaved per prompt (written by a
reviewer for prompts-unseen30.jsonl; wall and CPU time after the first token, every round's
source, drafts and times).
usage: unseen_rounds.py PROMPTS OUT.json --configs auto,b2,b3 [--ids a,b] [--max-tokens 128] [--temp 0.7 --seed 1]
Configs: auto (bench's: profile block + block_by_context + verify_cost + lookup_block),
 bN (block N, no by_context, profile lookup_block), auto_nolook (lookup 0), auto_lbN (lookup_block N),
 auto_nods (no datastore), bN_nolook, ...
"""

import argparse
import json
import os
import sys
import time

import dflash2_mlx  # noqa: F401  (binds the fast BLAS before MLX loads)
import mlx.core as mx
from dflash2_cli.common import engine_flags
from dflash2_cli.loading import load_engine
from dflash2_mlx.prompts import load_prompts
from dflash2_mlx.text import chat_prompt_ids
from dflash2_mlx.engine.generation import GenerationParams
from dflash2_mlx.sampling import SamplingParams

ap = argparse.ArgumentParser()
ap.add_argument("prompts")
ap.add_argument("out")
ap.add_argument("--configs", default="auto")
ap.add_argument("--ids", default=None)
ap.add_argument("--max-tokens", type=int, default=128)
ap.add_argument("--temp", type=float, default=0.0)
ap.add_argument("--seed", type=int, default=None)
ap.add_argument("--repeats", type=int, default=1)
ap.add_argument("--full-vocab", action="store_true")
ap.add_argument("--top-p", type=float, default=1.0)
a = ap.parse_args()

pair, resolved, eng = load_engine(
    None,
    None,
    None,
    True,
    lambda s: print(s, file=sys.stderr),
    engine_flags(full_vocab=a.full_vocab),
)
auto_block = eng.block.size
by_ctx = tuple(eng.block.by_context)
print(
    "engine: block",
    auto_block,
    "by_context",
    by_ctx,
    "lookup_block",
    eng.lookup_block,
    file=sys.stderr,
)
ds = pair.decoder.datastore
LOOK = pair.decoder.lookup

prompts = load_prompts(a.prompts)
if a.ids:
    want = a.ids.split(",")
    prompts = [p for p in prompts if p.id in want]


def params_for(cfg, temp, seed):
    parts = cfg.split("_")
    base = parts[0]
    kw = dict(
        max_tokens=a.max_tokens,
        lookup_block=eng.lookup_block,
        sampling=SamplingParams(temperature=temp, seed=seed, top_p=a.top_p),
    )
    if base == "auto":  # exactly what chat / serve run (greedy: what bench runs)
        kw.update(eng.drafting.fields(temp, pair.drafter.config.block_size))
    elif base == "plain":
        kw.update(speculative=False)
    else:
        kw.update(block_size=int(base[1:]))
    look, store = LOOK, ds
    for p in parts[1:]:
        if p == "nolook":
            look = 0
        elif p == "nods":
            store = None
        elif p.startswith("lb"):
            kw["lookup_block"] = int(p[2:])
    return GenerationParams(**kw), look, store


def run_cfg(ids, cfg, temp, seed):
    params, look, store = params_for(cfg, temp, seed)
    pair.decoder.lookup, pair.decoder.datastore = look, store
    try:
        evs, out, t_first = [], [], None
        c_first = None
        t_prev = None
        for ev in pair.stream(list(ids), params):
            now = time.perf_counter()
            if t_first is None:
                t_first = now
                c_first = time.process_time()
            else:
                evs.append(
                    dict(
                        n=len(ev.tokens),
                        drafted=ev.drafted,
                        acc=ev.accepted,
                        w=ev.block_size,
                        src=ev.source,
                        d=round(ev.draft_ms, 2),
                        v=round(ev.verify_ms, 2),
                        wall=round((now - t_prev) * 1000, 2),
                    )
                )
            t_prev = now
            out.extend(ev.tokens)
        secs = time.perf_counter() - t_first
        cpu = time.process_time() - c_first
    finally:
        pair.decoder.lookup, pair.decoder.datastore = LOOK, ds
    return out, secs, evs, cpu


def plain_run(ids, temp, seed):
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    from dflash2_mlx.bench import _float32

    if temp == 0:  # bench.plain_decode's loop, with CPU time from the first token too
        kw = dict(sampler=lambda x: mx.argmax(x, axis=-1), logits_processors=[_float32])
    else:
        mx.random.seed(seed)
        kw = dict(sampler=make_sampler(temp=temp, top_p=a.top_p))
    out, t_first, c_first = [], None, None
    for tok, _ in generate_step(mx.array(list(ids)), pair.model, max_tokens=a.max_tokens, **kw):
        tok = int(tok)
        if t_first is None:
            t_first = time.perf_counter()
            c_first = time.process_time()
        out.append(tok)
        if tok in pair.eos_ids:
            break
    return out, time.perf_counter() - t_first, time.process_time() - c_first


configs = a.configs.split(",")
res = dict(
    settings=dict(
        auto_block=auto_block,
        by_context=by_ctx,
        lookup_block=eng.lookup_block,
        configs=configs,
        temp=a.temp,
        top_p=a.top_p,
        seed=a.seed,
        max_tokens=a.max_tokens,
    ),
    rows=[],
)
# warmup
ids0 = chat_prompt_ids(pair.tokenizer, prompts[0].messages)
plain_run(ids0, 0.0, None)
for c in configs:
    run_cfg(ids0, c, a.temp, a.seed)
for p in prompts:
    ids = chat_prompt_ids(pair.tokenizer, p.messages)
    for r in range(a.repeats):
        seed = (a.seed + r) if a.seed is not None else None
        load = os.getloadavg()[0]
        ptoks, psecs, pcpu = plain_run(ids, a.temp, seed)
        row = dict(
            id=p.id,
            category=p.category,
            prompt_len=len(ids),
            repeat=r,
            load1=round(load, 2),
            plain=dict(tokens=len(ptoks), secs=round(psecs, 4), cpu=round(pcpu, 4)),
            runs={},
        )
        for c in configs:
            out, secs, evs, cpu = run_cfg(ids, c, a.temp, seed)
            row["runs"][c] = dict(
                tokens=len(out),
                secs=round(secs, 4),
                cpu=round(cpu, 4),
                identical=(out == ptoks),
                rounds=len(evs),
                events=evs,
            )
        res["rows"].append(row)
        n = max(len(ptoks) - 1, 1)
        msg = f"{p.id:12s} load {load:.2f} plain {n / psecs:5.1f}"
        for c in configs:
            rr = row["runs"][c]
            m = max(rr["tokens"] - 1, 1)
            tau = (rr["tokens"] - 1) / max(rr["rounds"], 1)
            msg += f" | {c} x{(m / rr['secs']) / (n / psecs):.2f} cpu x{(m / rr['cpu']) / (n / pcpu):.2f} tau {tau:.2f}{'' if rr['identical'] else ' DIFF'}"
        print(msg, flush=True)
        json.dump(res, open(a.out, "w"))
