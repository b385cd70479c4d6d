"""OpenAI-compatible HTTP server (FastAPI + uvicorn) over one `Pair`: `dflash2 serve`.

Endpoints
  POST /v1/chat/completions   messages -> chat template -> generation (stream: SSE)
  POST /v1/completions        prompt (string, token ids, or a batch of one) -> generation
  GET  /v1/models, /v1/models/{id}, GET /health, GET /metrics (Prometheus text format)

Request fields honoured: model (optional; must name the served model, else 404), messages /
prompt, max_tokens or max_completion_tokens (default: the server's, clipped to the context),
temperature (0 = greedy), top_p, top_k (0 or -1 = off), min_p, seed: each one a request leaves
out takes the server's default (`dflash2 serve --temp/--top-p/--top-k/--min-p/--seed`, else
the target's generation_config.json, else greedy; not OpenAI's T = 1), stop
(string or up to 16 strings; never emitted), stream, stream_options.include_usage,
and on chat prediction ({"type": "content", "content": text}: Predicted Outputs, a hint that
only drafts: where the answer follows it, its tokens are proposed; the output is unchanged).
Sampling is the library's lossless rejection sampling: output follows the target exactly.
Refused with a 400 naming the field unless neutral: n, logprobs, top_logprobs, functions,
function_call (use tools), response_format, presence/frequency/repetition penalties,
logit_bias, modalities, audio, reasoning_effort, web_search_options, store, best_of, echo,
suffix; unknown fields. Accepted and unused (cannot change the output): user, metadata,
service_tier, prompt_cache_key, safety_identifier.
Messages: roles system / developer (sent to the template as system) / user / assistant (with
tool_calls, and reasoning_content, which the template may drop) / tool (tool_call_id);
content a string or a list of text parts (joined with newlines).

Tools (chat): tools (function tools; strict true is refused: arguments are the model's own),
tool_choice, parallel_tool_calls. They are rendered by the model's own chat template and the
reply is parsed by the tool parser mlx-lm declares for the tokenizer (mlx_lm/tool_parsers/); a
model without one, or whose template does not render tools, answers tools with a 400.
  auto      calls are parsed into message.tool_calls, finish_reason "tool_calls"
  none      the tools are left out of the prompt and nothing is parsed
  required  the opening of a call, as the template renders one, is prefilled: the reply
  {"type": "function", "function": {"name": N}}   is a call (to N: the opening names it);
            a template whose calls do not open with a fixed text gets a 400
  parallel_tool_calls false: the reply ends with the first call.
A call text the parser refuses stays in content, verbatim. Streaming sends each call as
delta.tool_calls: {index, id, type, function: {name, arguments: ""}}, then {index, function:
{arguments}} (the official client joins them).

Reasoning (chat): with a template that has a thinking section (<think>...</think>, as Qwen3),
message.reasoning_content / delta.reasoning_content carry it and content the answer.
chat_template_kwargs: variables for the template, each checked against the variables it reads
(enable_thinking: a boolean; without a switch in the template, only what the model does
anyway: false without thinking markers, true with them). The server's
default: `dflash2 serve --thinking/--no-thinking` (create_app(thinking=...)). Speculation runs
through the thinking section like anywhere else.

Extension fields
  usage.dflash2 = {rounds, drafted, accepted, tau, acceptance_rate, lookup_rounds, block_size,
                   speculative, cached_tokens, prefill_ms, decode_ms, decode_tokens_per_s}
      rounds: draft-verify rounds (the prefill is not one); drafted / accepted: draft tokens
      proposed / kept; tau = (accepted + rounds) / rounds, tokens per round bonus included;
      lookup_rounds: rounds drafted by context lookup (the --lookup option) instead of the drafter;
      block_size: tokens verified per round (1 with speculative off).
      cached_tokens (= usage.prompt_tokens_details.cached_tokens): prompt tokens served by the
      prompt cache (the engine state of recent requests, reused by prefix), not prefilled.
      usage.completion_tokens_details.{accepted,rejected}_prediction_tokens: draft tokens
      taken from the prediction that the target kept / refused.
      usage.completion_tokens counts every token the engine committed, the end-of-turn token
      and tokens of the last round past a stop string included.
  chat only: usage.completion_tokens_details.reasoning_tokens (thinking markers included);
  usage.dflash2.tool_calls; usage.dflash2.reasoning = {tokens, rounds, drafted, accepted, tau}:
      the rounds that began inside the thinking section and their drafts.
  /v1/models data[i].dflash2 = {speculative, drafter, drafter_version, draft_vocab, lookup,
                                block_size, trained_block_size, context_length,
                                default_max_tokens, max_queue, tool_calling, thinking,
                                prompt_cache_mb}
  /v1/models data[i].sampling_defaults = {temperature, top_p, top_k, min_p, seed,
                                          source: {field: "--temp" ... | "generation_config.json"
                                                   | "default"}}
  /metrics adds dflash2_tool_calls_total, dflash2_unparsed_tool_calls_total,
  dflash2_reasoning_{tokens,rounds,accepted_tokens}_total.

Errors: {"error": {"message", "type", "param", "code"}}, each counted in /metrics by endpoint
and status and logged as one line (no traceback); a bad value is quoted by its first characters
only. 400 bad input (invalid JSON, nested over 64 levels, a lone UTF-16 surrogate anywhere, a
prompt / prediction / stop string over its limit), 401 missing or wrong API key, 403 Host or
Origin not allowed, 404 unknown model or route, 413 body over --max-body-mb (refused while it is
read), 415 a POST that is not application/json, 499 (counted only) a client that left, 500 a
server fault (details in the log only), 503 queue full (+ Retry-After: the queue's length times
an exponential average of recent generation times) or shutting down.

Limits (serve/limits.py, `ServeLimits`): the body size while it is read; prompt, prediction and
stop lengths in characters before tokenizing (a bound only text over the token limit exceeds)
and in tokens before queueing. Requests run one at a time on a worker thread; `max_queue` more
may wait, a request being tokenized (off the event loop, one at a time) holding its place. A
client that disconnects cancels its generation, between prefill chunks too; one log line each.
temperature below 1e-30 is greedy (its limit; float32 would overflow); top_p always keeps the
most likely token.

Local by design (serve/security.py, `SecurityPolicy`): binds 127.0.0.1; answers only Host
headers that name a loopback host (or --allowed-hosts); refuses cross-origin browser requests
unless --cors names the origin (then CORS headers and preflights); only application/json POSTs;
--api-key: `Authorization: Bearer KEY` on all but /health (constant-time compare); responses
show a drafter's name, never a server path; X-Forwarded-For only from --trust-proxy addresses.

Shutdown (serve/lifecycle.py): on Ctrl-C / SIGTERM the port closes, waiting requests get a JSON
503, the running generation has --shutdown-grace seconds, then a stream ends with an error
event and `data: [DONE]`, a whole answer with a JSON 503.

Text is exactly the tokenizer's decode of the generated ids, continuing the prompt (a first
token's leading space is kept; text.py's IncrementalDecoder).

Pointing an agent at the server: any OpenAI client, base URL http://127.0.0.1:8000/v1, any API
key (the --api-key one if set), model = the served id (GET /v1/models). A tool loop with the
official client:

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="local")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    while True:
        msg = client.chat.completions.create(model="qwen3-4b", messages=messages,
                                             tools=tools).choices[0].message
        messages.append(msg)
        if not msg.tool_calls:
            break
        for call in msg.tool_calls:  # run each tool, send its result back
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": get_weather(**json.loads(call.function.arguments))})
    print(msg.content)
"""

from .app import create_app, default_context_length, display_name
from .lifecycle import run as run_server
from .limits import ServeLimits
from .security import SecurityPolicy

__all__ = [
    "SecurityPolicy",
    "ServeLimits",
    "create_app",
    "default_context_length",
    "display_name",
    "run_server",
]
