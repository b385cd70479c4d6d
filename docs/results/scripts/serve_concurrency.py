"""Aggregate throughput of OpenAI-compatible servers under concurrent streaming chat clients, on
the embedded SmolLM2 pair (issue 15's measurement).

Servers, each started here on 127.0.0.1 (a free port) and stopped after its waves:
  a  `mlx_lm.server --model <the embedded SmolLM2 folder>`, its batching flags at their defaults
     (recorded); started after `import dflash2_mlx` binds the same BLAS dflash2 uses (the Linux
     mlx wheel's own BLAS is the netlib reference; --mlx-lm-blas stock keeps that instead)
  b  `dflash2 serve`, one request at a time (`--max-batch 1` where that flag exists)
  c  `dflash2 serve --max-batch N` (skipped, with a message, while `dflash2 serve --help` has no
     --max-batch)
For each number of clients C (1, 2, 4, 8): C threads, each with the official `openai` client,
take the bundled held-out prompts from one queue (each prompt once) and stream greedy chat
completions (temperature 0, max_tokens from --max-tokens). Aggregate tokens/s = the sum of the
completion tokens (usage) / wall time of the wave; TTFT per request = time to the first content.
Every output is compared with that prompt's output in the same server's 1-client wave (waves
run in the order given, 1 first), and the servers' prompt token counts with each other's.

Usage: nice -n 10 python serve_concurrency.py OUT.json [--prompts 8] [--max-tokens 256]
       [--clients 1,2,4,8] [--servers a,b,c] [--max-batch 8]
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import dflash2_mlx  # noqa: F401  (binds the optimized BLAS before MLX loads, as in the servers)

# Starts the shipped mlx_lm.server unchanged, after dflash2_mlx has bound the BLAS.
MLX_LM_BOUND = (
    "import sys, dflash2_mlx; from mlx_lm.server import main; sys.argv[0] = 'mlx_lm.server'; main()"
)
MLX_LM_BATCH_FLAGS = ("--decode-concurrency", "--prompt-concurrency", "--prompt-cache-size")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dflash2_command() -> list[str]:
    exe = shutil.which("dflash2")
    return [exe] if exe else [sys.executable, "-m", "dflash2_cli"]


def serve_has_max_batch() -> bool:
    out = subprocess.run(
        dflash2_command() + ["serve", "--help"], capture_output=True, text=True, timeout=120
    ).stdout
    return "--max-batch" in out


def mlx_lm_defaults() -> dict:
    """The batching-related defaults of the installed mlx_lm.server (it builds its parser
    inside main(), so they are read from that function's source), and whether --help has them."""
    import inspect
    import re

    import mlx_lm
    import mlx_lm.server

    source = inspect.getsource(mlx_lm.server.main)
    help_text = subprocess.run(
        [sys.executable, "-m", "mlx_lm", "server", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    out = {"mlx_lm": mlx_lm.__version__, "given": "none (defaults)"}
    for flag in MLX_LM_BATCH_FLAGS:
        m = re.search(re.escape(f'"{flag}"') + r"[^)]*?default=([^,\n)]+)", source)
        out[flag] = m.group(1).strip() if m and flag in help_text else None
    return out


class Server:
    """A server subprocess on a free port; `start` waits until /health answers and one short
    request has been served (that also loads a lazily loaded model)."""

    def __init__(self, name: str, argv: list[str], timeout: float, workdir: Path):
        self.name, self.timeout = name, timeout
        self.port = free_port()
        self.argv = argv + ["--host", "127.0.0.1", "--port", str(self.port)]
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / f"server-{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + self.timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.name} exited:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(
            f"server {self.name} did not serve in {self.timeout} s:\n" + self.log_tail()
        )

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def one_request(client, model: str, messages, max_tokens: int) -> dict:
    """One streaming greedy chat completion: its text, usage and timings."""
    t0 = time.perf_counter()
    ttft, parts, usage, finish = None, [], None, None
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        temperature=0.0,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta is not None and choice.delta.content:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                parts.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    if usage is None:
        raise RuntimeError("the stream ended without usage (stream_options.include_usage)")
    return {
        "text": "".join(parts),
        "completion_tokens": usage.completion_tokens,
        "prompt_tokens": usage.prompt_tokens,
        "finish_reason": finish,
        "ttft_s": round(ttft, 4) if ttft is not None else None,
        "seconds": round(time.perf_counter() - t0, 4),
    }


def wave(client, model: str, prompts, clients: int, max_tokens: int) -> dict:
    """`clients` threads take the prompts from one queue; returns per-prompt results + wall."""
    todo = list(range(len(prompts)))
    lock = threading.Lock()
    results: list[dict | None] = [None] * len(prompts)
    errors: list[BaseException] = []

    def worker():
        while True:
            with lock:
                if not todo or errors:
                    return
                i = todo.pop(0)
            try:
                results[i] = one_request(client, model, prompts[i].messages, max_tokens)
            except Exception as exc:  # reported after the wave, with the prompt id
                with lock:
                    errors.append(RuntimeError(f"prompt {prompts[i].id}: {exc!r}"))

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    tokens = sum(r["completion_tokens"] for r in results)
    ttfts = [r["ttft_s"] for r in results if r["ttft_s"] is not None]
    return {
        "clients": clients,
        "wall_s": round(wall, 4),
        "completion_tokens": tokens,
        "aggregate_tps": round(tokens / wall, 4),
        "ttft_s_median": round(statistics.median(ttfts), 4) if ttfts else None,
        "ttft_s_max": round(max(ttfts), 4) if ttfts else None,
        "requests": [dict(r, id=p.id) for p, r in zip(prompts, results)],
    }


def run_server(
    server: Server, model: str | None, prompts, clients: list[int], max_tokens: int
) -> dict:
    """Start `server`, run the waves, stop it. `model`: the id to send (None: the first one
    /v1/models lists)."""
    from openai import OpenAI

    print(f"[{server.name}] starting: {' '.join(server.argv)}", flush=True)
    t0 = time.perf_counter()
    server.start()
    try:
        client = OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=3600)
        model = model or client.models.list().data[0].id
        one_request(client, model, [{"role": "user", "content": "Hi"}], 4)  # warm-up
        print(f"[{server.name}] serving after {time.perf_counter() - t0:.1f} s", flush=True)
        waves, reference = [], None
        for c in clients:
            w = wave(client, model, prompts, c, max_tokens)
            texts = [r["text"] for r in w["requests"]]
            reference = reference or texts
            w["identical"] = [t == ref for t, ref in zip(texts, reference)]
            w["all_identical"] = all(w["identical"])
            waves.append(w)
            print(
                f"[{server.name}] {c} client(s): {w['completion_tokens']} tokens in "
                f"{w['wall_s']:.1f} s = {w['aggregate_tps']:.1f} tok/s, TTFT median "
                f"{w['ttft_s_median']} s, identical {sum(w['identical'])}/{len(texts)}",
                flush=True,
            )
    finally:
        server.stop()
    return {"command": server.argv, "model": model, "waves": waves}


def ratios(runs: dict, num: str, den: str, clients: list[int]) -> dict | None:
    if num not in runs or den not in runs:
        return None
    tps = {k: {w["clients"]: w["aggregate_tps"] for w in runs[k]["waves"]} for k in (num, den)}
    return {str(c): round(tps[num][c] / tps[den][c], 4) for c in clients}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="JSON to write")
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts (round-robin)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--clients", default="1,2,4,8", help="concurrent clients per wave; 1 first")
    ap.add_argument("--servers", default="a,b,c", help="a: mlx_lm.server, b/c: dflash2 serve")
    ap.add_argument("--max-batch", type=int, default=8, help="(c)'s --max-batch")
    ap.add_argument("--mlx-lm-blas", choices=("dflash2", "stock"), default="dflash2")
    ap.add_argument("--start-timeout", type=float, default=900.0)
    args = ap.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    args.servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    if args.clients[0] != 1 or any(c < 1 for c in args.clients):
        ap.error("--clients must start with 1 (the reference outputs) and be >= 1")
    if not set(args.servers) <= {"a", "b", "c"}:
        ap.error("--servers takes a, b and/or c")
    return args


def server_commands(args, folder: str, has_max_batch: bool) -> dict[str, list[str]]:
    queue = ["--max-queue", str(max(8, max(args.clients)))]  # every wave's clients admitted
    d2 = dflash2_command() + ["serve", "--log-level", "warning"] + queue
    mlx_lm = (
        [sys.executable, "-c", MLX_LM_BOUND]
        if args.mlx_lm_blas == "dflash2"
        else [sys.executable, "-m", "mlx_lm", "server"]
    )
    return {
        "a": mlx_lm + ["--model", folder],
        "b": d2 + (["--max-batch", "1"] if has_max_batch else []),
        "c": d2 + ["--max-batch", str(args.max_batch)],
    }


def comparisons(runs: dict, expected_prompt_tokens: list[int], clients: list[int]) -> dict:
    """Prompt token counts, output identity within and across servers, throughput ratios."""
    one = {k: [r["text"] for r in v["waves"][0]["requests"]] for k, v in runs.items()}
    counts = {k: [r["prompt_tokens"] for r in v["waves"][0]["requests"]] for k, v in runs.items()}
    return {
        "prompt_tokens": {"chat_template_here": expected_prompt_tokens, **counts},
        "prompt_tokens_match": all(c == expected_prompt_tokens for c in counts.values()),
        "outputs_identical_within_server": {
            k: all(w["all_identical"] for w in v["waves"]) for k, v in runs.items()
        },
        "outputs_identical_across_servers": len({json.dumps(t) for t in one.values()}) <= 1,
        "ratios": {
            "c/a": ratios(runs, "c", "a", clients),
            "c/b": ratios(runs, "c", "b", clients),
            "b/a": ratios(runs, "b", "a", clients),
        },
    }


def main():
    args = parse_args()
    from transformers import AutoTokenizer

    from dflash2_mlx import bench as B
    from dflash2_mlx import bench_env
    from dflash2_mlx.embedded import ensure_smollm2
    from dflash2_mlx.prompts import load_prompts
    from dflash2_mlx.text import chat_prompt_ids

    folder = str(ensure_smollm2())
    chosen = B.select_prompts(load_prompts("heldout"), args.prompts)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    expected_prompt_tokens = [len(chat_prompt_ids(tokenizer, p.messages)) for p in chosen]
    has_max_batch = serve_has_max_batch()
    argv = server_commands(args, folder, has_max_batch)
    models = {"a": "default_model", "b": None, "c": None}  # mlx_lm: the --model it loaded
    runs, skipped = {}, {}
    workdir = Path(tempfile.mkdtemp(prefix="serve_concurrency-"))
    env = bench_env.environment()
    for name in args.servers:
        if name == "c" and not has_max_batch:
            skipped["c"] = "`dflash2 serve --help` has no --max-batch: batched serving not built"
            print(f"[c] skipped: {skipped['c']}", flush=True)
            continue
        server = Server(name, argv[name], args.start_timeout, workdir)
        runs[name] = run_server(server, models[name], chosen, args.clients, args.max_tokens)
    checks = comparisons(runs, expected_prompt_tokens, args.clients)
    result = {
        "what": "Streaming greedy chat requests from C concurrent openai clients (threads) "
        "against each server on the embedded SmolLM2-135M pair; aggregate tok/s = completion "
        "tokens / wall time of the wave; outputs compared with the same server's 1-client "
        "wave. Servers run one after another on a shared machine: compare within a file. "
        "Both keep their prompt caches at the defaults, so a prompt repeated in a later wave "
        "may reuse its prefill (prompts of ~40-100 tokens against answers of up to max_tokens).",
        "command": "python docs/results/scripts/serve_concurrency.py " + " ".join(sys.argv[1:]),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            k: env.get(k)
            for k in (
                "chip",
                "blas",
                "blas_threads",
                "blas_core",
                "blas_kernel",
                "blas_kernel_threads",
                "blas_split",
                "mlx",
                "mlx_lm",
                "device",
            )
        },
        "mlx_lm_server": dict(mlx_lm_defaults(), blas=args.mlx_lm_blas) if "a" in runs else None,
        "dflash2_serve_has_max_batch": has_max_batch,
        "prompts": [p.id for p in chosen],
        "max_tokens": args.max_tokens,
        "clients": args.clients,
        **checks,
        "skipped": skipped,
        "servers": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in checks.items() if k != "prompt_tokens"}), flush=True)
    print(f"results: {args.out} (server logs in {workdir})")


if __name__ == "__main__":
    main()
