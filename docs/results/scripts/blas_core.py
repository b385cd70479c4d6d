"""OpenBLAS kernel sets compared on this CPU for the embedded SmolLM2 target: verify cost by
width (the skinny products of decoding and verifying) and a 512-token prefill, each kernel set
in its own process (OPENBLAS_CORETYPE), alternated ABAB so that load drift hits both.
Usage: python blas_core.py OUT.json [--cores SkylakeX,Haswell] [--rounds 2]
(`--cores stock,SkylakeX`: against the reference BLAS the Linux MLX wheel ships)
A child (--child) prints one JSON line for the kernel set its environment names."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def child() -> None:
    from dflash2_mlx import _blas  # binds the BLAS before MLX loads

    import mlx.core as mx
    from dflash2_mlx import load_pair
    from dflash2_mlx.costs import context_ids, verify_costs

    pair = load_pair("smollm2-135m")
    verify = verify_costs(pair, [1, 2, 4, 8, 16], repeats=9)
    adapter = pair.decoder.target
    ids = mx.array([context_ids(adapter.vocab_size, 512)])
    prefill = []
    for _ in range(4):
        cache = adapter.make_cache()
        t0 = time.perf_counter()
        adapter.prefill(ids, cache, pair.decoder.prefill_chunk, 1)
        mx.eval([c.state for c in cache])
        prefill.append((time.perf_counter() - t0) * 1000)
    info = _blas.info()
    out = {"core": info.core, "threads": info.threads, "verify_ms": verify["ms"]}
    out["prefill_512_ms"] = round(statistics.median(prefill[1:]), 2)
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--cores", default="SkylakeX,Haswell")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        return child()
    runs: dict[str, list[dict]] = {}
    for _ in range(args.rounds):
        for core in args.cores.split(","):
            # "stock": the reference BLAS the Linux MLX wheel ships (dflash2 binds none)
            pin = {"DFLASH2_BLAS": "stock"} if core == "stock" else {"OPENBLAS_CORETYPE": core}
            env = {**os.environ, **pin}
            cmd = [sys.executable, __file__, "--child"]
            line = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
            got = json.loads(line.stdout.strip().splitlines()[-1])
            print(core, got, flush=True)
            runs.setdefault(core, []).append(got)
    summary = {}
    for core, rs in runs.items():
        widths = rs[0]["verify_ms"]
        summary[core] = {
            "verify_ms": {
                w: round(statistics.median(r["verify_ms"][w] for r in rs), 2) for w in widths
            },
            "prefill_512_ms": round(statistics.median(r["prefill_512_ms"] for r in rs), 2),
        }
        ms = summary[core]["verify_ms"]
        summary[core]["ratio"] = {w: round(ms[w] / ms["1"], 3) for w in ms}
    from dflash2_mlx.bench_env import environment  # noqa: E402  (after the children: binds BLAS)

    result = {
        "command": " ".join(sys.argv),
        "environment": environment(),
        "runs": runs,
        "summary": summary,
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
