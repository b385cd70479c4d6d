"""OpenAI-compatible HTTP server (FastAPI + uvicorn) over one `Pair`: `dflash2 serve`.

Endpoints: POST /v1/chat/completions, POST /v1/completions (SSE streaming or not), GET
/v1/models, /v1/models/{id}, /health, /metrics (Prometheus). The request fields honoured and
refused, tools, reasoning, the prompt cache, `usage.dflash2`, errors, limits, security and
shutdown are documented in one place: docs/serve.md.

Modules: app (routes, lifespan), handler (one request: tokenize, plan, queue, answer), schemas
and tools (validation, 400s naming the field), chat_prompt / reply / reasoning (the chat
template, tool-call and thinking parsing), queue (admission: the bounded queue), scheduler (the
worker thread: requests batched together), jobs (what they exchange), body /
limits / security / guard / lifecycle (hardening), format (response objects), metrics.
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
