"""A short chat request sent 1 s after a long prompt, to an idle `dflash2 serve`: its time to
first token with the long prefill under way, and alone. Before 2026-12-06 the first prefill of
an idle server went through whole, so the short request waited for all of it.

Usage: python short_behind_long.py URL OUT.json [--words 1500]
(the server: `dflash2 serve --port PORT`, the embedded pair, default --max-batch)
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time

from openai import OpenAI


def ttft(client: OpenAI, content: str, max_tokens: int) -> float:
    t0 = time.perf_counter()
    stream = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": content}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
    )
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - t0
    return first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url")
    ap.add_argument("out")
    ap.add_argument("--words", type=int, default=1500)
    args = ap.parse_args()
    client = OpenAI(base_url=f"{args.url}/v1", api_key="local", max_retries=0)
    words = "the river city night market garden letter music winter station".split()
    rng = random.Random(0)
    document = " ".join(rng.choice(words) for _ in range(args.words))
    long_prompt = f"Summarize this text:\n{document}"
    short = "What is the capital of Spain?"
    got: dict = {}
    worker = threading.Thread(target=lambda: got.update(long=ttft(client, long_prompt, 8)))
    worker.start()
    time.sleep(1.0)
    got["short_behind_long"] = ttft(client, short, 16)
    worker.join()
    got["short_alone"] = ttft(client, short, 16)
    result = {"command": "python docs/results/scripts/short_behind_long.py URL OUT", **got}
    print(json.dumps(result, indent=1))
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
