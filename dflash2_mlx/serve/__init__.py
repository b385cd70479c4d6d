"""OpenAI-compatible HTTP server (FastAPI + uvicorn) over one `Pair`: `dflash2 serve`.

Endpoints (app.ROUTES): POST /v1/chat/completions, /v1/completions, /v1/responses (OpenAI),
/v1/messages and /v1/messages/count_tokens (Anthropic), SSE streaming or not; GET /v1/models,
/v1/models/{id}, /health, /metrics (Prometheus). The request fields honoured and
refused, tools, reasoning, the prompt cache, `usage.dflash2`, errors, limits, security and
shutdown are documented in one place: docs/serve.md.

Modules: app (routes, lifespan), handler and plan (one request: tokenize, plan, queue,
answer), schemas, token_fields and tools (validation, 400s naming the field), chat_prompt /
reply / reasoning / constrained / response_format (the chat template, tool-call and thinking
parsing, grammars), choices (n > 1), fim (fill-in-the-middle), messages_* and responses_*
(the Anthropic and Responses APIs over the chat path), queue (admission: the bounded queue),
scheduler (the worker thread: requests batched together), jobs (what they exchange), body /
limits / security / guard / lifecycle (hardening), format and stream (response objects),
metrics.
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
