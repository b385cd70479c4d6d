"""Tests and the network: a package index probe (skip with a reason when it cannot be reached)
and a fake Hugging Face cache (so that Hub code runs without the Hub)."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest


@functools.lru_cache(maxsize=None)
def _index_has(name: str, version: str | None) -> str | None:
    """None when pip (with this machine's pip config) can find `name==version` (any version
    when None); else why not."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "index",
        "versions",
        name,
        "--retries",
        "0",
        "--timeout",
        "15",
        "--disable-pip-version-check",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"
    listed = [line for line in proc.stdout.splitlines() if line.startswith("Available versions:")]
    versions = listed[0].split(":", 1)[1].replace(",", " ").split() if listed else []
    if proc.returncode == 0 and versions and (version is None or version in versions):
        return None
    lines = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()
    return f"pip exit {proc.returncode}: {lines[-1]}"


def require_pypi(name: str, version: str | None = None) -> None:
    """Skip the calling test when the package index cannot serve `name==version` (or `name`)."""
    why = _index_has(name, version)
    if why is not None:
        spec = name if version is None else f"{name}=={version}"
        pytest.skip(f"needs {spec} from the package index, which cannot be reached ({why})")


def fake_hf_repo(cache: Path, repo: str, files=("config.json",), rev: str = "a" * 40) -> Path:
    """A Hugging Face cache entry for `repo` (blobs, a snapshot of symlinks, refs/main)."""
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(rev)
    (root / "blobs").mkdir()
    snap = root / "snapshots" / rev
    snap.mkdir(parents=True)
    for i, name in enumerate(files):
        (root / "blobs" / f"b{i}").write_text("{}")
        (snap / name).symlink_to(Path("../../blobs") / f"b{i}")
    return snap
