"""Model downloads and caches: a folder as is, or a Hugging Face repo id fetched (only the
files a target, a drafter or a tokenizer needs); what the Hugging Face and dflash2 caches
hold (`dflash2 models`, `doctor`).
"""

from __future__ import annotations

from pathlib import Path

from .errors import FetchError, ModelNotFoundError
from .paths import cache_root

# mlx-lm's own download patterns for a target; a drafter needs only its config and weights.
TARGET_PATTERNS = (
    "*.json",
    "model*.safetensors",
    "*.py",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jsonl",
    "*.jinja",
)
DRAFTER_PATTERNS = ("*.json", "*.safetensors")
TOKENIZER_PATTERNS = tuple(p for p in TARGET_PATTERNS if "safetensors" not in p)
_PATTERNS = {"target": TARGET_PATTERNS, "drafter": DRAFTER_PATTERNS}


def is_repo_id(text: str) -> bool:
    return (
        not text.startswith((".", "/", "~"))
        and text.count("/") == 1
        and all(part.strip() for part in text.split("/"))
    )


def fetch(
    path_or_repo: str | Path,
    what: str = "target",
    *,
    revision: str | None = None,
    offline: bool = False,
) -> Path:
    """A local folder as is, or a Hugging Face repo id downloaded (or found in the cache).

    `what` is "target", "drafter" or "target tokenizer" (which files to fetch, and how errors
    name it); `revision` a branch, tag or commit of the repo. Raises FetchError.
    """
    path = Path(path_or_repo).expanduser()
    if path.exists():
        if not path.is_dir():
            raise FetchError(f"{what} {path}: expected a model folder, found a file")
        return path
    if not is_repo_id(str(path_or_repo)):
        raise FetchError(
            f"{what} {path_or_repo}: no such folder (and not a Hugging Face repo id 'owner/name')"
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    patterns = list(_PATTERNS.get(what, TOKENIZER_PATTERNS))
    try:
        return Path(
            snapshot_download(
                str(path_or_repo),
                revision=revision,
                allow_patterns=patterns,
                local_files_only=offline,
            )
        )
    except LocalEntryNotFoundError:
        raise _not_cached(str(path_or_repo), what, offline) from None
    except GatedRepoError:
        raise FetchError(
            f"{what} {path_or_repo}: gated on the hub; accept its terms and log in "
            "(`hf auth login`)"
        ) from None
    except RepositoryNotFoundError:
        raise FetchError(
            f"{what} {path_or_repo}: no such repository on the hub (or it is private)"
        ) from None
    except RevisionNotFoundError as exc:
        raise FetchError(f"{what} {path_or_repo}: {exc}") from None
    except (OSError, ValueError) as exc:
        raise FetchError(
            f"{what} {path_or_repo}: download failed: {type(exc).__name__}: {exc}"
        ) from None


def _not_cached(repo: str, what: str, offline: bool) -> FetchError:
    """A repo not in the local cache, where the hub was not asked or could not be reached:
    each cause with its own remedy (`dflash2 pull` itself lands here when offline)."""
    from huggingface_hub import constants

    why = (
        "offline mode asks no hub: load it once without offline mode"
        if offline
        else "HF_HUB_OFFLINE is set, so the hub is not asked: unset it to download"
        if constants.HF_HUB_OFFLINE
        else "the hub cannot be reached: download it where it can (`dflash2 pull` fetches "
        "ahead of time into this cache)"
    )
    local = Path(repo).expanduser()
    folder = local.parent.is_dir() and local.parent != Path(".")  # a mistyped local path?
    return FetchError(
        f"{what} {repo}: "
        + (f"no such folder in {local.parent}, and " if folder else "")
        + f"not in the local Hugging Face cache; {why}, or pass a local folder"
    )


def hf_cache() -> list[dict]:
    """Model repos in the local Hugging Face cache (empty if there is no cache)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(hf_cache_dir())
    except CacheNotFound:
        return []
    except OSError as exc:
        raise ModelNotFoundError(f"cannot read the Hugging Face cache: {exc}") from None
    return sorted(
        (
            {
                "repo": r.repo_id,
                "size_bytes": r.size_on_disk,
                "files": r.nb_files,
                "path": str(r.repo_path),
            }
            for r in info.repos
            if r.repo_type == "model"
        ),
        key=lambda d: d["repo"].lower(),
    )


def hf_cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def dflash2_cache() -> tuple[Path, list[dict]]:
    """The dflash2 cache root and the models converted into it (e.g. the embedded target)."""
    root = cache_root()
    found = []
    models = root / "models"
    if models.is_dir():
        for d in sorted(p for p in models.iterdir() if p.is_dir() and not p.name.startswith(".")):
            size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
            found.append({"name": d.name, "size_bytes": size, "path": str(d)})
    return root, found
