"""A tiny-pair `dflash2 serve` in a process of its own, for tests that signal it.

`python tests/serve_child.py GRACE_S [MAX_BATCH]` prints its port, serves until SIGINT, exits with the
server's code (130 after Ctrl-C), as `dflash2 serve` does.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import dflash2_mlx  # noqa: F401  (binds the optimized BLAS before MLX loads)

sys.path.insert(0, str(Path(__file__).parent))
import tiny  # noqa: E402
from test_serve import make_tokenizer  # noqa: E402

from dflash2_mlx.api import Pair  # noqa: E402
from dflash2_mlx.serve import ServeLimits, create_app, run_server  # noqa: E402


def main(grace: float, max_batch: int) -> int:
    pair = Pair.from_models(
        tiny.make_target("llama"), make_tokenizer(), tiny.make_drafter(2, block_size=4)
    )
    app = create_app(
        pair,
        model_name="tiny",
        max_queue=4,
        max_batch=max_batch,
        default_max_tokens=8,
        limits=ServeLimits(shutdown_grace_s=grace),
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    return run_server(app, sock, log_level="info")


if __name__ == "__main__":
    # A background job of a non-interactive shell starts with SIGINT ignored, and uvicorn
    # restores (then re-raises into) that: serve as a foreground `dflash2 serve` does.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    code = main(float(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 4)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as the CLI: no interpreter teardown after MLX ran on other threads
