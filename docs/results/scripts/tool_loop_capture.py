"""One tool loop against the real `dflash2 serve` app with the official `openai` client, printed
as a compact transcript (the README's captured example).

The model is the test suite's tiny tool-calling pair (tests/tiny_tools.py): a Qwen-style
(hermes) template with `<tool_call>`, a 2-layer llama trained for a few seconds to call
get_weather for "weather in paris?" and to answer from the tool's result, and a random drafter.
Not a real LLM: it knows only those two turns. The loop is the README's serve example: request
with `tools` -> finish_reason "tool_calls" -> run the tool locally -> send the `tool` message
back -> final answer. Dev-only (imports from tests/).

Usage: nice python docs/results/scripts/tool_loop_capture.py [--port 0] [--out transcript.txt]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))

import openai  # noqa: E402
import tiny_tools as tt  # noqa: E402
import uvicorn  # noqa: E402

from dflash2_mlx.serve import create_app  # noqa: E402

MODEL = "tiny-tools"
USAGE_KEYS = ("rounds", "drafted", "accepted", "tau", "lookup_rounds", "block_size", "tool_calls")


@contextlib.contextmanager
def serving(app, port: int):
    """uvicorn on 127.0.0.1:`port` (0: a free one) in a thread; yields the base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and thread.is_alive() and time.time() < deadline:
        time.sleep(0.01)
    if not server.started:
        raise RuntimeError(f"uvicorn did not start on 127.0.0.1:{port}")
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(15)


def get_weather(city: str) -> str:
    """The fake tool: the result the tiny model was trained to read back."""
    assert city == "paris", f"the tiny model only knows paris, got {city!r}"
    return tt.RESULT


def dflash2_usage(response) -> dict:
    extra = response.usage.model_extra["dflash2"]
    return {k: extra[k] for k in USAGE_KEYS if k in extra}


def tool_loop(client, say) -> None:
    """The README's loop, verbatim in shape, with each turn printed."""
    messages = list(tt.ASK)
    say(f"-> user: {messages[0]['content']!r}  tools=[get_weather]")
    while True:
        r = client.chat.completions.create(
            model=MODEL, messages=messages, tools=tt.TOOLS, temperature=0, max_tokens=64
        )
        choice = r.choices[0]
        msg = choice.message
        messages.append(msg)
        say(f"<- finish_reason={choice.finish_reason!r} content={msg.content!r}")
        if msg.tool_calls:
            calls = [c.model_dump() for c in msg.tool_calls]
            say(f"   tool_calls={json.dumps(calls)}")
        say(
            f"   usage: prompt_tokens={r.usage.prompt_tokens} "
            f"completion_tokens={r.usage.completion_tokens} dflash2={json.dumps(dflash2_usage(r))}"
        )
        if not msg.tool_calls:
            return
        for call in msg.tool_calls:
            result = get_weather(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            say(
                f"-> tool: {call.function.name}({call.function.arguments}) ran locally, "
                f"result {result}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0, help="127.0.0.1 port (0: a free one)")
    ap.add_argument("--out", type=Path, help="also write the transcript here")
    args = ap.parse_args()

    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    with tempfile.TemporaryDirectory() as folder:
        pair = tt.trained_pair(Path(folder))
    app = create_app(pair, model_name=MODEL, default_max_tokens=64, context_length=1024)
    with serving(app, args.port) as base:
        say(
            f"server: {base}/v1  model: {MODEL} (tests/tiny_tools.py: trained 2-layer llama, "
            f"random drafter)  openai {openai.__version__}"
        )
        client = openai.OpenAI(base_url=base + "/v1", api_key="local", max_retries=0, timeout=60)
        tool_loop(client, say)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
