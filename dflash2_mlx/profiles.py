"""Stored autotune profiles: JSON under `cache_root()/autotune`, keyed by device (chip, and
the BLAS on CPU), mlx version, target, drafter, quantization signature, draft vocabulary,
lookup and a shipped datastore left off; `profile_advice` finds one again for chat, serve and
bench (read once: `ProfileAdvice`)."""

from __future__ import annotations

import errno
import hashlib
import json
import platform
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping

from .errors import ConfigError
from .quant import quant_signature
from .values import is_int
from .paths import cache_root, write_whole

SCHEMA = "dflash2.autotune/1"


def _identity(name: str) -> str:
    """A folder as its absolute path plus a fingerprint of its config and weight files (so a
    drafter retrained into the same folder gets a new profile); a repo id as given."""
    p = Path(str(name)).expanduser()
    try:
        if not p.exists():
            return str(name)
        p = p.resolve()
        files = (
            sorted(f for f in p.iterdir() if f.suffix in (".json", ".safetensors"))
            if p.is_dir()
            else [p]
        )
        stamp = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]
        return f"{p}#{hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:12]}"
    except OSError:
        return str(name)


def chip_name() -> str:
    """The chip or CPU model ('Apple M3 Max', 'AMD EPYC'), best effort."""
    import mlx.core as mx

    try:
        name = str(mx.device_info().get("device_name") or "")
        if name:
            return name
    except (AttributeError, RuntimeError, TypeError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def device_key() -> str:
    """'gpu Apple M3 Max', or on CPU 'cpu AMD EPYC, blas scipy-openblas x1 Haswell avx2 x2' (CPU
    timings depend on the BLAS, its threads, its kernel set, the shim's kernel and its
    threads)."""
    import mlx.core as mx

    from . import _blas

    dev = mx.default_device()
    kind = "gpu" if dev.type == mx.DeviceType.gpu else "cpu"
    key = f"{kind} {chip_name()}"
    if kind == "cpu":
        info = _blas.info()
        key += f", blas {info.route}" + (f" x{info.threads}" if info.threads else "")
        key += f" {info.core}" if info.core else ""
        key += f" {info.kernel}" if info.kernel else ""
        key += f" x{info.kernel_threads}" if info.kernel_threads > 1 else ""
    return key


def profile_key(pair, target: str, drafter: str) -> dict:
    import mlx.core as mx

    from .engine.datastore import find_datastore

    key = {
        "device": device_key(),
        "mlx": getattr(mx, "__version__", "?"),
        "target": _identity(target),
        "drafter": _identity(drafter),
        "quantization": quant_signature(pair),
        "draft_vocab": pair.drafter.draft_vocab_size,  # it changes the draft cost
        "lookup": pair.decoder.lookup,  # it changes the acceptance
    }
    if pair.decoder.datastore is None and find_datastore(drafter) is not None:
        key["datastore"] = "off"  # so does a shipped datastore left off (only then: old keys hold)
    return key


def profile_dir(root: str | Path | None = None) -> Path:
    if root is not None:
        return Path(root)
    return cache_root() / "autotune"


def check_storable(root: str | Path | None = None) -> None:
    """Refuses (ConfigError) before an autotune run whose profile could not be stored: the
    measurement would be lost at its end."""
    folder = profile_dir(root)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
            pass  # a real write: os.access says yes to root on a read-only mount
    except OSError as exc:
        raise ConfigError(_unstorable(folder, exc)) from None


def _unstorable(folder: Path, exc: OSError) -> str:
    fix = "free some space there, or set" if exc.errno == errno.ENOSPC else "set"
    return (
        f"{folder}: cannot store the autotune profile there ({exc.strerror or exc}): {fix} "
        "DFLASH2_HOME to a writable folder with room"
    )


def profile_path(key: Mapping, root: str | Path | None = None) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return profile_dir(root) / f"{digest}.json"


def save_profile(profile: Mapping, root: str | Path | None = None) -> Path:
    path = profile_path(profile["key"], root)
    try:
        return write_whole(path, json.dumps(profile, indent=2) + "\n")
    except OSError as exc:
        raise ConfigError(_unstorable(path.parent, exc)) from None


def _read_profile(path: Path) -> tuple[dict | None, str | None]:
    """(the profile at `path`, None) or (None, why it is not one); (None, None): no file."""
    if not path.exists():
        return None, None
    try:
        profile = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return (
            None,
            f"{path}: the autotune profile is unreadable ({exc}), ignored: rerun --autotune",
        )
    if not isinstance(profile, dict) or profile.get("schema") != SCHEMA:
        return None, f"{path}: not a {SCHEMA} autotune profile, ignored: rerun --autotune"
    return profile, None


def load_profile(key: Mapping, root: str | Path | None = None) -> dict | None:
    """The stored profile with exactly this key, else None (a damaged file counts as none:
    `profile_advice(...).damaged` says why)."""
    return _matching(_read_profile(profile_path(key, root))[0], key)


def _matching(profile: dict | None, key: Mapping) -> dict | None:
    if profile is None:
        return None
    if json.dumps(profile.get("key"), sort_keys=True) != json.dumps(key, sort_keys=True):
        return None
    return profile


@dataclass(frozen=True)
class ProfileAdvice:
    """What this machine's stored autotune profile says for one pair, read once: each field
    None or () where no profile matches (other device, mlx version, models or quantization)
    or it did not measure that. Blocks are not clamped: settings.choose_block clamps every
    recommendation to the trained size, with the reason."""

    block: int | None = None  # "chosen_block"
    lookup_block: int | None = None  # GenerationParams.lookup_block
    by_context: tuple[tuple[int, int], ...] = ()  # GenerationParams.block_by_context
    by_temperature: tuple[tuple[float, int], ...] = ()  # settings.block_for_temperature
    width_cost: Callable[[int, int], float] | None = None  # batch_costs.width_costs
    verify_cost: Callable[[int, int], float] | None = None  # batch_costs.context_costs
    damaged: str | None = None  # why a stored file was ignored (it does not read as a profile)


def profile_advice(pair, target: str, drafter: str, *, root=None) -> ProfileAdvice:
    """The stored profile of this pair on this machine, read once (a profile is an
    optimisation, never a failure: whatever does not read is left out)."""
    from .batch_costs import context_costs, width_costs
    from .engine.generation import check_block_by_context, check_block_by_temperature

    try:
        key = profile_key(pair, target, drafter)
    except Exception:  # noqa: BLE001 - no key to look it up by: no profile applies
        return ProfileAdvice()
    path = profile_path(key, root)
    stored, damaged = _read_profile(path)
    profile = _matching(stored, key)
    if profile is None:
        if stored is not None:  # a file copied from elsewhere, or its name's hash collides
            damaged = f"{path}: the profile of another device or pair, ignored: rerun --autotune"
        return ProfileAdvice(damaged=damaged)
    trained = pair.drafter.config.block_size
    advice = ProfileAdvice(
        _count(profile.get("chosen_block")),
        _count(profile.get("chosen_lookup_block")),
        _falling(profile, "block_by_context", check_block_by_context, trained),
        _falling(profile, "block_by_temperature", check_block_by_temperature, trained),
        _safely(width_costs, profile),
        _safely(context_costs, profile),
    )
    dropped = _unread_fields(profile, advice, trained)
    if dropped:
        fields = ", ".join(dropped)
        why = f"{path}: the profile's {fields} (missing or unreadable) ignored: rerun --autotune"
        advice = replace(advice, damaged=why)
    return advice


def _unread_fields(profile: dict, advice: ProfileAdvice, trained: int) -> list[str]:
    """The profile's fields that `advice` left out as unreadable; blocks by context or
    temperature left out for a bad or missing chosen_block (they fall from it) name it."""
    dropped = [
        field
        for field, kept in (
            ("chosen_block", advice.block),
            ("chosen_lookup_block", advice.lookup_block),
            ("block_by_context", advice.by_context),
            ("block_by_temperature", advice.by_temperature),
        )
        if profile.get(field) not in (None, [], ()) and not kept
    ]
    chosen = profile.get("chosen_block")
    if is_int(chosen, 1) and chosen <= trained:
        return dropped
    dropped = [f for f in dropped if not f.startswith("block_by_")]
    falling = ("block_by_context", "block_by_temperature")
    if chosen is None and any(profile.get(f) for f in falling):
        dropped.insert(0, "chosen_block")
    return dropped


def _count(value) -> int | None:
    return value if is_int(value, 1) else None


def _safely(read: Callable, profile: dict):
    try:
        return read(profile)
    except Exception:  # noqa: BLE001 - a damaged table: the default cost model applies
        return None


def _falling(profile: dict, field: str, check, trained: int) -> tuple:
    """The profile's `field` pairs, checked by `check`: () when it was made before they were
    measured, or their blocks do not fall from its chosen block within the trained size."""
    try:
        pairs = check(profile.get(field) or ())
    except Exception:  # noqa: BLE001
        return ()
    blocks = [profile.get("chosen_block")] + [b for _, b in pairs]
    if not all(isinstance(a, int) and trained >= a > b for a, b in zip(blocks, blocks[1:])):
        return ()
    return pairs


def recommended_block(
    pair, target: str, drafter: str, *, root: str | Path | None = None
) -> int | None:
    """The autotuned block for this pair on this machine (`dflash2 bench --autotune`), or None
    (ProfileAdvice)."""
    return profile_advice(pair, target, drafter, root=root).block


def recommended_lookup_block(
    pair, target: str, drafter: str, *, root: str | Path | None = None
) -> int | None:
    """The autotuned lookup block (GenerationParams.lookup_block) for this pair on this
    machine, or None when no profile matches or it measured no lookup round."""
    return profile_advice(pair, target, drafter, root=root).lookup_block


def recommended_block_by_context(
    pair, target: str, drafter: str, *, root: str | Path | None = None
) -> tuple[tuple[int, int], ...]:
    """The autotuned blocks by context (GenerationParams.block_by_context) for this pair on
    this machine (ProfileAdvice)."""
    return profile_advice(pair, target, drafter, root=root).by_context
