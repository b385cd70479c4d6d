"""mlx-lm's flags (mlx_lm.server, mlx_lm.generate, mlx_lm.chat) that dflash2 spells otherwise
or does not take: what to write instead. Click's own hint is a spelling match, and for
`--model` it named `--model-name`, which serves the embedded model under the name given."""

from __future__ import annotations

FOREIGN_FLAGS = {
    "--model": "give the model as the argument (an alias from `dflash2 models`), or a folder or "
    "repo id as --target with its --drafter (--model-name only renames what serve serves)",
    "--draft-model": "--drafter takes a DFlash / DFlash2 drafter (a folder or a repo id); a "
    "small language model is not one (`dflash2 train` makes one)",
    "--num-draft-tokens": "--block N verifies N tokens a round (N - 1 drafts); by default the "
    "autotune profile's block, else the drafter's",
    "--decode-concurrency": "--max-batch N (requests decoded together)",
    "--prompt-cache-size": "--prompt-cache-mb MB (a memory budget, not a count of prompts)",
    "--prompt-cache-bytes": "--prompt-cache-mb MB",
    "--allowed-origins": "--cors ORIGIN (repeatable; a web page from any origin it does not name, "
    "localhost's included, is refused)",
    "--adapter-path": "adapters are not loaded: fuse them into the model (mlx_lm.fuse) and give "
    "the fused folder as --target",
    "--trust-remote-code": "not needed: dflash2 runs mlx-lm's own model code only",
    "--chat-template-args": "--thinking / --no-thinking set enable_thinking; other template "
    "variables go in a request's chat_template_kwargs",
    "--max-kv-size": "serve's --context-length N caps prompt plus answer (no rotating cache)",
    "--system-prompt": "chat's --system TEXT",
    "--xtc-probability": "XTC sampling is not supported",
    "--xtc-threshold": "XTC sampling is not supported",
}


def foreign_flag_hint(option: str) -> str | None:
    """The message for an mlx-lm flag dflash2 does not take; None for any other flag."""
    hint = FOREIGN_FLAGS.get(option)
    return None if hint is None else f"no such option: {option} (mlx-lm's); here: {hint}"
