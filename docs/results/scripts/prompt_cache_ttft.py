"""Time to first token of an agent-style conversation with and without the prompt cache, on the
embedded SmolLM2 pair (shipped drafter), greedy -> smollm2-prompt-cache.json.

The conversation: a system prompt holding tool definitions (JSON schemas, as an agent client
sends them), then turns alternating a user request and a tool result; every turn resends the
whole history with the model's own earlier answers re-rendered through the chat template. Each
turn runs through a PromptCache (a request leases the stored state, as `dflash2 serve` does)
and cold (a fresh session); both outputs must be identical. Repeated --reps times (a fresh
cache each time); TTFT is the median, cold and cached measured back to back in one process.

Usage: nice -n 10 python prompt_cache_ttft.py OUT.json [--turns 10] [--max-tokens 64]
       [--reps 3] [--block N] [--report 2,5,10]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import dflash2_mlx as d2
from dflash2_mlx.embedded import ensure_smollm2
from dflash2_mlx.engine.prompt_cache import PromptCache
from dflash2_mlx.registry import EMBEDDED_DRAFTER, resolve
from dflash2_mlx.text import chat_prompt_ids

TOOLS = [
    {
        "name": "read_file",
        "description": "Read a text file of the workspace.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Path relative to the workspace root."},
                "start_line": {"type": "integer"},
                "end_line": {"type": "integer"},
            },
            "required": ["path"],
        },
    },
    {
        "name": "write_file",
        "description": "Create or overwrite a file with the given content.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
    {
        "name": "search_code",
        "description": "Search the workspace for a regular expression.",
        "parameters": {
            "type": "object",
            "properties": {
                "pattern": {"type": "string"},
                "glob": {"type": "string", "description": "Only files matching it."},
                "max_results": {"type": "integer", "default": 20},
            },
            "required": ["pattern"],
        },
    },
    {
        "name": "run_command",
        "description": "Run a shell command in the workspace; returns its "
        "exit status, stdout and stderr.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "timeout_s": {"type": "integer", "default": 60},
            },
            "required": ["command"],
        },
    },
    {
        "name": "list_directory",
        "description": "List the entries of a directory.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
    {
        "name": "web_search",
        "description": "Search the web; returns titles, URLs and snippets.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "count": {"type": "integer", "default": 5}},
            "required": ["query"],
        },
    },
]

SYSTEM = (
    "You are a careful coding agent working in the user's repository. Think about what the "
    "user needs, then either answer or call one of the tools below. To call a tool, answer "
    'with a JSON object {"name": ..., "arguments": {...}} and nothing else. Tool results '
    "come back in the next message. Keep answers short and precise.\n\n# Tools\n"
    + "\n".join(json.dumps(t, indent=1) for t in TOOLS)
)

USER_TURNS = [
    "The tests in tests/test_parser.py fail since yesterday. Can you find out why?",
    "Tool result (run_command): exit 1\nFAILED tests/test_parser.py::test_dates - "
    "ValueError: unconverted data remains: Z\n1 failed, 41 passed in 2.31s",
    "Where is the date parsing done?",
    "Tool result (search_code): src/parser/dates.py:14: return datetime.strptime(text, "
    "'%Y-%m-%dT%H:%M:%S')\nsrc/parser/dates.py:31: def parse_timestamp(text: str):",
    "Show me how to fix it so that a trailing Z is accepted.",
    "Tool result (read_file): def parse_timestamp(text: str):\n    text = text.strip()\n"
    "    return datetime.strptime(text, '%Y-%m-%dT%H:%M:%S')",
    "Write the fixed function.",
    "Tool result (write_file): wrote 9 lines to src/parser/dates.py",
    "Run the tests again and tell me what happened.",
    "Tool result (run_command): exit 0\n42 passed in 2.18s",
    "Summarise what was wrong and what you changed, in two sentences.",
    "Thanks. Is there anything else in that file that could break the same way?",
]


def first_token(pair, ids, params, session):
    """(ms to the first token, prefill event, the rest of the event stream)."""
    t0 = time.perf_counter()
    events = pair.stream(ids, params, session)
    ev = next(events)
    return (time.perf_counter() - t0) * 1000.0, ev, events


def answer(first, events, lease=None):
    tokens = list(first.tokens)
    for ev in events:
        if lease is not None:
            lease.observe(ev)
        tokens += ev.tokens
    return tokens


def run_conversation(pair, params, turns: int, cold_every_turn: bool = True):
    cache = PromptCache(pair.decoder, 1 << 30)
    history, rows = [], []
    for turn in range(1, turns + 1):
        user = {"role": "user", "content": USER_TURNS[(turn - 1) % len(USER_TURNS)]}
        messages = [{"role": "system", "content": SYSTEM}] + history + [user]
        ids = chat_prompt_ids(pair.tokenizer, messages)
        t0 = time.perf_counter()
        lease = cache.lease(ids)
        ms, first, events = first_token(pair, ids, params, lease.session)
        ms_cached = (time.perf_counter() - t0) * 1000.0  # the lease included
        lease.observe(first)
        out_cached = answer(first, events, lease)
        lease.close()
        row = {
            "turn": turn,
            "prompt_tokens": len(ids),
            "cached_tokens": first.reused_tokens,
            "prefilled_tokens": first.prompt_tokens,
            "ttft_cached_ms": round(ms_cached, 2),
            "prefill_cached_ms": round(first.verify_ms, 2),
        }
        if cold_every_turn:
            ms, first, events = first_token(pair, ids, params, None)
            out_cold = answer(first, events)
            row.update(
                ttft_cold_ms=round(ms, 2),
                prefill_cold_ms=round(first.verify_ms, 2),
                identical=out_cold == out_cached,
                answer_tokens=len(out_cached),
            )
        rows.append(row)
        print(json.dumps(row), flush=True)
        eos = pair.eos_ids
        text = pair.tokenizer.decode([t for t in out_cached if t not in eos])
        history += [user, {"role": "assistant", "content": text}]
    return rows, cache.stats()


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--block", type=int, default=None)
    ap.add_argument("--report", default="2,5,10")
    args = ap.parse_args()
    pair = d2.load_pair(ensure_smollm2(), EMBEDDED_DRAFTER)
    block = (
        args.block
        or resolve(None, None, None, build_embedded=False).block_size
        or pair.drafter.config.block_size
    )
    params = d2.GenerationParams(max_tokens=args.max_tokens, block_size=block)
    chat_prompt_ids(pair.tokenizer, [{"role": "user", "content": "warm up"}])
    pair.generate(chat_prompt_ids(pair.tokenizer, [{"role": "user", "content": "Hi"}]), params)
    reps, stats = [], None
    for r in range(args.reps):
        print(f"repetition {r + 1}/{args.reps}", flush=True)
        rows, stats = run_conversation(pair, params, args.turns)
        reps.append(rows)
    per_turn = []
    for i in range(args.turns):
        rows = [rep[i] for rep in reps]
        cold = statistics.median(r["ttft_cold_ms"] for r in rows)
        cached = statistics.median(r["ttft_cached_ms"] for r in rows)
        per_turn.append(
            {
                "turn": i + 1,
                "prompt_tokens": rows[0]["prompt_tokens"],
                "cached_tokens": rows[0]["cached_tokens"],
                "prefilled_tokens": rows[0]["prefilled_tokens"],
                "ttft_cold_ms": round(cold, 2),
                "ttft_cached_ms": round(cached, 2),
                "cached_over_cold": round(cached / cold, 4),
                "identical": all(r["identical"] for r in rows),
            }
        )
    report = [int(t) for t in args.report.split(",") if int(t) <= args.turns]
    res = {
        "what": "Time to first token (ms, median of the repetitions) of an agent-style "
        "conversation on the embedded SmolLM2-135M pair (shipped drafter, context "
        "lookup 3), greedy: system prompt with 6 tool definitions, turns alternating a "
        "user request and a tool result, the model's earlier answers re-rendered by the "
        "chat template. cached: the request leases the stored state from a PromptCache "
        "(what `dflash2 serve` does) and prefills only the tokens after the cached "
        "prefix; cold: a fresh session prefills the whole prompt. TTFT includes the "
        "lease (prefix match) and the first token's pick. Goal: cached <= 20% of cold "
        "from turn 2 on, outputs identical.",
        "script": "docs/results/scripts/prompt_cache_ttft.py",
        "command": "nice -n 10 python docs/results/scripts/prompt_cache_ttft.py OUT "
        f"--turns {args.turns} --max-tokens {args.max_tokens} --reps {args.reps} "
        f"--block {block}",
        "environment": {**d2.doctor(), "cpu": cpu_model()},
        "settings": {
            "turns": args.turns,
            "max_tokens": args.max_tokens,
            "reps": args.reps,
            "block_size": block,
            "lookup": pair.decoder.lookup,
            "tools": len(TOOLS),
            "prefill_chunk": pair.decoder.prefill_chunk,
        },
        "report": [t for t in per_turn if t["turn"] in report],
        "all_identical": all(t["identical"] for t in per_turn),
        "max_cached_over_cold_from_turn_2": max(t["cached_over_cold"] for t in per_turn[1:]),
        "per_turn": per_turn,
        "prompt_cache_last_rep": {
            "hits": stats.hits,
            "misses": stats.misses,
            "evictions": stats.evictions,
            "entries": stats.entries,
            "bytes": stats.nbytes,
        },
        "repetitions": reps,
    }
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    print(json.dumps(res["report"], indent=1))


if __name__ == "__main__":
    main()
