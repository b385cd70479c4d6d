"""Prefill time vs prompt length on the embedded SmolLM2 pair: the engine's prefill (the first
event of `Pair.stream`: chunked target forward with feature capture, first token, lookup index)
against plain mlx-lm's prefill of the same ids in the same process (mlx_lm.generate's way:
chunks through the model evaluating only the cache, the last row's logits at the end), same
chunk size, plus the engine's per-chunk times (they grow with the chunk's offset: attention over
the cache) -> JSON. With --abba each length runs plain, engine, engine, plain (the means cancel
a load that drifts linearly; the first run of a new size also pays for fresh buffers).
Usage: python prefill_scaling.py OUT.json [LENGTHS, default 512,1024,2048,4096,8192] [--abba]"""

import json
import os
import platform
import sys
import time

import dflash2_mlx as d2  # binds the optimized BLAS before MLX loads
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from dflash2_mlx import _blas
from dflash2_mlx.embedded import ensure_smollm2
from dflash2_mlx.registry import EMBEDDED_DRAFTER

CHUNK = 512
HERE = os.path.dirname(os.path.abspath(__file__))


def prompt_ids(tokenizer, n: int) -> list[int]:
    """n ids of real text (the repository's docs, repeated as needed)."""
    root = os.path.join(HERE, "..", "..", "..")
    text = "".join(
        open(os.path.join(root, p)).read()
        for p in ("README.md", "docs/architecture.md")
        if os.path.exists(os.path.join(root, p))
    )
    ids = tokenizer.encode(text)
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


def plain_prefill(model, ids: list[int]) -> float:
    cache = make_prompt_cache(model)
    t0 = time.perf_counter()
    rest = mx.array(ids)[None]
    while rest.shape[1] > CHUNK:
        model(rest[:, :CHUNK], cache=cache)
        mx.eval([c.state for c in cache])
        rest = rest[:, CHUNK:]
    mx.eval(model(rest, cache=cache)[:, -1])
    return time.perf_counter() - t0


def engine_prefill(pair, ids: list[int]) -> tuple[float, list[float]]:
    marks = []
    t0 = time.perf_counter()
    events = pair.stream(
        ids,
        d2.GenerationParams(max_tokens=1),
        cancel=lambda: marks.append(time.perf_counter()) and False,
    )
    next(events)
    end = time.perf_counter()
    events.close()
    edges = [t0] + marks + [end]
    return end - t0, [round(b - a, 3) for a, b in zip(edges, edges[1:])]


def main(out_path: str, lengths: list[int], abba: bool = False) -> None:
    pair = d2.load_pair(ensure_smollm2(), EMBEDDED_DRAFTER)
    assert pair.decoder.prefill_chunk == CHUNK
    warm = prompt_ids(pair.tokenizer, 64)
    plain_prefill(pair.model, warm)
    engine_prefill(pair, warm)
    rows = []
    for n in lengths:
        ids = prompt_ids(pair.tokenizer, n)
        plain, engine, chunks = [plain_prefill(pair.model, ids)], [], None
        for _ in range(2 if abba else 1):
            seconds, chunks = engine_prefill(pair, ids)
            engine.append(seconds)
        if abba:
            plain.append(plain_prefill(pair.model, ids))
        plain_s, engine_s = sum(plain) / len(plain), sum(engine) / len(engine)
        row = {
            "prompt_tokens": n,
            "plain_mlx_lm_s": round(plain_s, 2),
            "engine_s": round(engine_s, 2),
            "engine_over_plain": round(engine_s / plain_s, 3),
            "plain_tokens_per_s": round(n / plain_s, 1),
            "engine_tokens_per_s": round(n / engine_s, 1),
            "engine_chunk_s": chunks,
            "runs_s": {
                "plain": [round(x, 2) for x in plain],
                "engine": [round(x, 2) for x in engine],
            },
            "load_average": os.getloadavg()[0],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    blas = _blas.info()
    res = {
        "what": "Prefill wall time vs prompt length, embedded SmolLM2-135M (fp32) + shipped "
        f"drafter, chunks of {CHUNK}. plain = mlx-lm's own prefill of the same ids "
        "(chunks evaluating the cache only, then the last row's logits); engine = the "
        "first event of Pair.stream (the same chunks through the target with the "
        "drafter's layer features captured, the first token, the lookup index). One "
        "process; "
        + (
            "per length plain, engine, engine, plain (means)."
            if abba
            else "per length plain then engine, once."
        ),
        "script": "docs/results/scripts/prefill_scaling.py",
        "environment": {
            "platform": f"{platform.system()} {platform.machine()}",
            "cpu_count": os.cpu_count(),
            "blas": blas.route,
            "blas_threads": blas.threads,
            "mlx": mx.__version__,
            "device": str(mx.default_device()),
        },
        "rows": rows,
    }
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--abba"]
    lens = [int(x) for x in args[1].split(",")] if len(args) > 1 else [512, 1024, 2048, 4096, 8192]
    main(args[0], lens, abba="--abba" in sys.argv)
