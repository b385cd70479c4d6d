"""Time to the first streamed token, before and after it went out from the prefill (not after
the next round): two library-made servers of the embedded pair, one from an older checkout.

    git worktree add /tmp/old_main f5ce088
    PYTHONPATH=/tmp/old_main python first_token_ab.py serve 8641 &
    python first_token_ab.py serve 8642 &
    python first_token_ab.py measure http://127.0.0.1:8641 http://127.0.0.1:8642 OUT.json

Streamed chat, greedy, max_tokens 64, the 7 bench prompts (the held-out file's first of each
category), 3 passes, the two servers interleaved per prompt.
"""

import json
import socket
import statistics
import sys
import time

import dflash2_mlx as d2


def serve(port: int) -> int:
    from dflash2_mlx.serve import create_app, run_server

    pair = d2.load_pair("smollm2-135m")
    app = create_app(pair, model_name="smollm2", default_max_tokens=64, max_batch=4)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)
    print("serving", d2.__file__, flush=True)
    return run_server(app, sock, log_level="warning")


def one(base: str, messages: list) -> tuple:
    import httpx

    body = {
        "messages": messages,
        "max_tokens": 64,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    first, text, usage = None, "", None
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for c in chunk.get("choices", []):
                piece = c["delta"].get("content")
                if piece and first is None:
                    first = time.perf_counter() - t0
                text += piece or ""
    return first, time.perf_counter() - t0, text, usage


def measure(old: str, new: str, out: str) -> None:
    from dflash2_mlx.diagnostics import doctor

    path = "dflash2_mlx/assets/prompts/heldout.jsonl"
    seen, chosen = set(), []
    for p in map(json.loads, open(path)):
        if p["category"] not in seen:
            seen.add(p["category"])
            chosen.append(p)
    rows = []
    for rep in range(3):
        for p in chosen:
            order = [("old", old), ("new", new)][:: 1 if rep % 2 == 0 else -1]
            got = {name: one(base, p["messages"]) for name, base in order}
            rows.append(
                {
                    "prompt": p["id"],
                    "pass": rep,
                    "ttft_old_ms": got["old"][0] * 1000,
                    "ttft_new_ms": got["new"][0] * 1000,
                    "total_old_ms": got["old"][1] * 1000,
                    "total_new_ms": got["new"][1] * 1000,
                    "prefill_ms": (got["new"][3] or {}).get("dflash2", {}).get("prefill_ms"),
                    "identical": got["old"][2] == got["new"][2],
                }
            )
            print(rows[-1], flush=True)
    info = doctor()
    with open("/proc/cpuinfo") as f:  # Linux
        info["cpu"] = next(
            (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?"
        )
    result = {
        "what": "streamed chat, embedded pair, max_tokens 64, greedy: time to the first content "
        "chunk and to the end; old: f5ce088 (first token after a round), new: from the prefill",
        "machine": {k: info[k] for k in ("platform", "cpu", "mlx", "device") if k in info}
        | {k: v for k, v in info.items() if k.startswith("blas")},
        "median_ttft_old_ms": statistics.median(r["ttft_old_ms"] for r in rows),
        "median_ttft_new_ms": statistics.median(r["ttft_new_ms"] for r in rows),
        "median_ttft_ratio_old_over_new": statistics.median(
            r["ttft_old_ms"] / r["ttft_new_ms"] for r in rows
        ),
        "median_total_ratio_old_over_new": statistics.median(
            r["total_old_ms"] / r["total_new_ms"] for r in rows
        ),
        "identical": all(r["identical"] for r in rows),
        "rows": rows,
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print({k: v for k, v in result.items() if k != "rows"})


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        sys.exit(serve(int(sys.argv[2])))
    measure(*sys.argv[2:5])
