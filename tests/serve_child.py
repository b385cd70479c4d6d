"""A tiny-pair `dflash2 serve` in a process of its own, for tests that signal it.

`python tests/serve_child.py GRACE_S [MAX_BATCH [STEP_S]]` prints its port, serves until SIGINT,
exits with the server's code (130 after Ctrl-C), as `dflash2 serve` does. STEP_S: every target
forward takes that long at least (a large model's step, or a long prefill chunk).
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
from test_serve import make_tokenizer, slow_pair  # noqa: E402

from dflash2_mlx.api import Pair  # noqa: E402
from dflash2_mlx.serve import ServeLimits, create_app, run_server  # noqa: E402


def main(grace: float, max_batch: int, step_s: float = 0.0) -> int:
    if step_s:
        pair = slow_pair(step_s)
    else:
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
    if not os.environ.get("SERVE_CHILD_INHERIT_SIGINT"):  # set: as a `&` job it stays
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a terminal's (pytest may run under nohup)
    args = sys.argv[1:]
    code = main(
        float(args[0]), int(args[1]) if len(args) > 1 else 4, float(args[2] if len(args) > 2 else 0)
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as the CLI: no interpreter teardown after MLX ran on other threads
