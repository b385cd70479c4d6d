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
Refused with a 400 naming the field unless neutral: n, logprobs, top_logprobs, tools,
tool_choice, functions, function_call, response_format, presence/frequency/repetition
penalties, logit_bias, modalities, audio, reasoning_effort, web_search_options,
store, best_of, echo, suffix; unknown fields. Accepted and unused (cannot change the output):
user, metadata, service_tier, parallel_tool_calls, prompt_cache_key, safety_identifier.
Messages: roles system / developer (sent to the template as system) / user / assistant;
content a string or a list of text parts (joined with newlines).

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
  /v1/models data[i].dflash2 = {speculative, drafter, drafter_version, draft_vocab, lookup,
                                block_size, trained_block_size, context_length,
                                default_max_tokens, max_queue, prompt_cache_mb}
  /v1/models data[i].sampling_defaults = {temperature, top_p, top_k, min_p, seed,
                                          source: {field: "--temp" ... | "generation_config.json"
                                                   | "default"}}

Errors: {"error": {"message", "type", "param", "code"}}; 400 bad input, 404 unknown model or
route, 503 + Retry-After when the queue is full. Requests run one at a time on a worker thread;
`max_queue` more may wait. A client that disconnects cancels its generation.
"""

from .app import create_app, default_context_length

__all__ = ["create_app", "default_context_length"]
