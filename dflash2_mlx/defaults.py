"""Defaults that the server and its command line share, in a module without MLX or FastAPI
(the CLI shows them in its help before anything heavy loads)."""

MAX_BATCH = 8  # requests generating together (engine/batch.py)
MAX_QUEUE = 8  # requests waiting while others generate (serve/queue.py)
PROMPT_CACHE_MB = 1024  # engine state of recent conversations (engine/prompt_cache.py)
MAX_BODY_MB = 4.0  # largest request body (serve/limits.py)
SHUTDOWN_GRACE_S = 10.0  # after Ctrl-C, how long running generations may finish
