"""Block-size autotuning: measure, decide, remember.

`autotune(pair, prompts, ...)` measures on this machine
- the target's verify cost for widths 1..B (dflash2_mlx.bench.verify_costs: dependent chain,
  medians, warm cache at a context depth),
- the drafter's cost per round for blocks 1..B (bench.draft_costs; block 1 drafts nothing),
- the per-position acceptance on a greedy calibration run at block B: p_k = P(draft k accepted |
  drafts 1..k-1 accepted), counted from the engine's per-round accepted counts,
and picks the block b <= B that maximizes expected committed tokens per second,

    E[tokens/round at b] / (draft_ms(b) + verify_ms(b)),   E = 1 + sum_{k<b} prod_{j<=k} p_j

(`choose_block`, a pure function). The acceptance measured at block B stands in for every
smaller block (draft k is assumed as likely to be accepted at block b > k as at B). Rounds
drafted by context lookup run no draft pass: draft_ms(b) counts only the calibration's share
of drafter rounds (`draft_share`), so a context that repeats itself favours longer blocks. Block 1
(plain decoding, "park") is a candidate. When the target or the drafter has quantized matmuls
(QuantizedLinear / QuantizedEmbedding or any layer with `bits` and `group_size`), the block is
capped at 5: a quantized verify is cheap per token but its cost grows fast with width on MLX
(spec 6.7).

The profile is stored as JSON under `cache_root()/autotune`, keyed by device (chip, and the
BLAS on CPU), mlx version, target, drafter and quantization signature (bits, group size, mode
and weight dtype of each model); `recommended_block(pair, target, drafter)` finds it again for
`chat` and `serve`, and returns None when any part of the key differs.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

SCHEMA = "dflash2.autotune/1"
QUANT_CAP = 5


# ----------------------------------------------------------------------------- quantization
def quantized_layers(module) -> list[dict]:
    """Quantized matmul layers of an MLX module, grouped by (kind, bits, group_size, mode)."""
    import mlx.nn as nn

    groups: Counter = Counter()
    for m in module.modules():
        if isinstance(m, nn.QuantizedEmbedding):
            kind = "Embedding"
        elif isinstance(m, nn.QuantizedLinear):
            kind = "Linear"
        elif hasattr(m, "bits") and hasattr(m, "group_size") and "scales" in m:
            kind = type(m).__name__  # e.g. mlx-lm's QuantizedSwitchLinear (MoE experts)
        else:
            continue
        groups[(kind, int(m.bits), int(m.group_size), str(getattr(m, "mode", "affine")))] += 1
    return [{"kind": k, "bits": b, "group_size": g, "mode": mode, "count": n}
            for (k, b, g, mode), n in sorted(groups.items())]


def weight_dtype(module) -> str:
    """The floating dtype holding most of a module's parameters ('bfloat16', 'float32', ...)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    sizes: Counter = Counter()
    for _, p in tree_flatten(module.parameters()):
        if mx.issubdtype(p.dtype, mx.floating):
            sizes[str(p.dtype).split(".")[-1]] += p.size
    return sizes.most_common(1)[0][0] if sizes else "none"


def quant_signature(pair) -> dict:
    """{"target": {"dtype", "quantized": [...]}, "drafter": {...}} of a loaded pair."""
    return {
        "target": {"dtype": weight_dtype(pair.model), "quantized": quantized_layers(pair.model)},
        "drafter": {"dtype": weight_dtype(pair.drafter),
                    "quantized": quantized_layers(pair.drafter)},
    }


def is_quantized(signature: Mapping) -> bool:
    return any(part.get("quantized") for part in signature.values())


def describe_quant(signature: Mapping) -> str:
    """'target q4 g64 affine (197 layers), bfloat16; drafter bfloat16' and the like."""
    parts = []
    for name, part in signature.items():
        qs = part.get("quantized") or []
        modes = sorted({(q["bits"], q["group_size"], q["mode"]) for q in qs})
        n = sum(q["count"] for q in qs)
        q = ", ".join(f"q{b} g{g} {m}" for b, g, m in modes)
        parts.append(f"{name} {q} ({n} layers), {part.get('dtype')}" if qs
                     else f"{name} {part.get('dtype')}")
    return "; ".join(parts)


# ----------------------------------------------------------------------------- the decision
def acceptance_probs(rounds: Iterable[tuple[int, int]],
                     max_drafted: int) -> tuple[list[float], list[int]]:
    """p_k for k = 1..max_drafted from (drafted, accepted) per round: the share of rounds that
    accepted draft k among those that drafted k and accepted drafts 1..k-1. Returns (p, the
    number of rounds behind each p_k); p_k = 0 where no round reached k."""
    rounds = list(rounds)
    probs, counts = [], []
    for k in range(1, max_drafted + 1):
        reached = [a for d, a in rounds if d >= k and a >= k - 1]
        counts.append(len(reached))
        probs.append(sum(1 for a in reached if a >= k) / len(reached) if reached else 0.0)
    return probs, counts


def expected_tokens(probs: Sequence[float], block: int) -> float:
    """E[committed tokens per round] at `block`: 1 (the bonus) + sum over drafts k < block of
    P(drafts 1..k all accepted)."""
    total, run = 1.0, 1.0
    for k in range(1, block):
        run *= probs[k - 1] if k - 1 < len(probs) else 0.0
        total += run
    return total


@dataclass(frozen=True)
class BlockRow:
    block: int
    verify_ms: float
    draft_ms: float
    round_ms: float
    expected_tokens: float
    expected_tps: float
    allowed: bool  # within max_block and the quantization cap


@dataclass(frozen=True)
class Choice:
    block: int
    rows: list[BlockRow]
    cap: int | None  # the quantization cap in force, if any

    def as_dict(self) -> dict:
        return {"block": self.block, "cap": self.cap, "rows": [asdict(r) for r in self.rows]}


def choose_block(verify_ms: Mapping[int, float], draft_ms: Mapping[int, float],
                 probs: Sequence[float], *, max_block: int, cap: int | None = None,
                 draft_share: float = 1.0) -> Choice:
    """The block b in 1..min(max_block, cap) maximizing E[tokens/round at b] / (draft_share *
    draft_ms(b) + verify_ms(b)) (ties: the smaller block); draft_share: the share of rounds
    that run the drafter (the others are drafted by context lookup, at no cost). Blocks
    without both costs are skipped. Rows report the expected draft ms per round."""
    limit = min(max_block, cap) if cap else max_block
    rows: list[BlockRow] = []
    for b in range(1, max_block + 1):
        if b not in verify_ms or (b > 1 and b not in draft_ms):
            continue
        v = float(verify_ms[b])
        d = draft_share * float(draft_ms[b]) if b > 1 else 0.0
        e = expected_tokens(probs, b)
        ms = v + d
        tps = 1000.0 * e / ms if ms > 0 else 0.0
        rows.append(BlockRow(b, round(v, 4), round(d, 4), round(ms, 4), round(e, 4),
                             round(tps, 3), b <= limit))
    allowed = [r for r in rows if r.allowed]
    if not allowed:
        raise ValueError("no block size has both a verify and a draft cost")
    best = max(allowed, key=lambda r: (r.expected_tps, -r.block))
    return Choice(best.block, rows, cap)


# ----------------------------------------------------------------------------- measurement
def calibrate(pair, prompts, block: int, *, max_tokens: int = 128,
              thinking: bool | None = None,
              progress: Callable[[int, int], None] | None = None) -> dict:
    """Greedy dflash2 runs at `block` over `prompts`: (drafted, accepted) of every full round
    (the last round of each generation is left out: it may be cut by max tokens or a stop),
    and the share of those rounds that ran the drafter (the rest were drafted by lookup)."""
    from .engine.loop import GenerationParams
    from .text import chat_prompt_ids

    rounds: list[tuple[int, int]] = []
    looked_up = 0
    for i, p in enumerate(prompts):
        ids = chat_prompt_ids(pair.tokenizer, p.messages, thinking=thinking)
        for ev in pair.stream(ids, GenerationParams(max_tokens=max_tokens, block_size=block)):
            if not ev.prefill and ev.finish_reason is None and ev.drafted:
                rounds.append((ev.drafted, ev.accepted))
                looked_up += ev.lookup
        if progress is not None:
            progress(i + 1, len(prompts))
    probs, counts = acceptance_probs(rounds, block - 1)
    tau = sum(a + 1 for _, a in rounds) / len(rounds) if rounds else 0.0
    return {"block": block, "prompts": len(prompts), "max_tokens": max_tokens,
            "rounds": len(rounds), "tau": round(tau, 4),
            "drafter_share": round(1 - looked_up / len(rounds), 4) if rounds else 1.0,
            "position_probs": [round(p, 4) for p in probs], "position_rounds": counts}


def autotune(pair, prompts, *, target: str, drafter: str, max_block: int | None = None,
             context: int = 256, repeats: int = 5, max_tokens: int = 128,
             thinking: bool | None = None,
             progress: Callable[[str], None] | None = None) -> dict:
    """Measure and decide; returns the profile (not stored: see save_profile)."""
    from . import bench

    say = progress or (lambda _msg: None)
    trained = pair.drafter.config.block_size
    B = int(max_block or trained)
    if not 1 <= B <= trained:
        from .errors import ParameterError
        raise ParameterError(f"block {B} must be in 1..{trained} (the drafter's trained block size)")
    key = profile_key(pair, target, drafter)
    cap = QUANT_CAP if is_quantized(key["quantization"]) and B > QUANT_CAP else None
    say(f"verify cost, widths 1..{B}, context {context}")
    verify = bench.verify_costs(pair, range(1, B + 1), context=context, repeats=repeats)
    say(f"draft cost, blocks 2..{B}")
    draft = bench.draft_costs(pair, range(1, B + 1), context=context, repeats=repeats)
    say(f"calibration: greedy at block {B} on {len(prompts)} prompts")
    calib = calibrate(pair, prompts, B, max_tokens=max_tokens, thinking=thinking,
                      progress=lambda i, n: say(f"calibration {i}/{n}"))
    choice = choose_block(verify["ms"], draft["ms"], calib["position_probs"], max_block=B, cap=cap,
                          draft_share=calib["drafter_share"])
    return {
        "schema": SCHEMA,
        "key": key,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "max_block": B,
        "trained_block": trained,
        "cap": cap,
        "cap_reason": (f"quantized matmuls ({describe_quant(key['quantization'])}): block capped "
                       f"at {QUANT_CAP}") if cap else None,
        "verify": {"context": context, "repeats": repeats,
                   "ms": {str(k): v for k, v in verify["ms"].items()},
                   "ratio": {str(k): v for k, v in verify["ratio"].items()}},
        "draft": {"ms": {str(k): v for k, v in draft["ms"].items()},
                  "feature_rows": draft["feature_rows"]},
        "acceptance": calib,
        "table": [asdict(r) for r in choice.rows],
        "chosen_block": choice.block,
    }


# ----------------------------------------------------------------------------- profiles
def _identity(name: str) -> str:
    """A folder as its absolute path plus a fingerprint of its config and weight files (so a
    drafter retrained into the same folder gets a new profile); a repo id as given."""
    p = Path(str(name)).expanduser()
    try:
        if not p.exists():
            return str(name)
        p = p.resolve()
        files = sorted(f for f in p.iterdir() if f.suffix in (".json", ".safetensors")) \
            if p.is_dir() else [p]
        stamp = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]
        return f"{p}#{hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:12]}"
    except OSError:
        return str(name)


def device_key() -> str:
    """'gpu Apple M3 Max', or on CPU 'cpu AMD EPYC, blas scipy-openblas x2' (CPU timings
    depend on the BLAS and its threads)."""
    import mlx.core as mx

    from . import _blas
    from .bench import chip_name

    dev = mx.default_device()
    kind = "gpu" if dev.type == mx.DeviceType.gpu else "cpu"
    key = f"{kind} {chip_name()}"
    if kind == "cpu":
        info = _blas.info()
        key += f", blas {info.route}" + (f" x{info.threads}" if info.threads else "")
    return key


def profile_key(pair, target: str, drafter: str) -> dict:
    import mlx.core as mx

    return {"device": device_key(), "mlx": getattr(mx, "__version__", "?"),
            "target": _identity(target), "drafter": _identity(drafter),
            "quantization": quant_signature(pair),
            "draft_vocab": pair.drafter.draft_vocab_size,  # it changes the draft cost
            "lookup": pair.decoder.lookup}  # it changes the acceptance


def profile_dir(root: str | Path | None = None) -> Path:
    if root is not None:
        return Path(root)
    from ._blas import cache_root

    return cache_root() / "autotune"


def profile_path(key: Mapping, root: str | Path | None = None) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return profile_dir(root) / f"{digest}.json"


def save_profile(profile: Mapping, root: str | Path | None = None) -> Path:
    path = profile_path(profile["key"], root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(profile, indent=2) + "\n")
    tmp.replace(path)
    return path


def load_profile(key: Mapping, root: str | Path | None = None) -> dict | None:
    """The stored profile with exactly this key, else None (a corrupt file counts as none)."""
    path = profile_path(key, root)
    try:
        profile = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(profile, dict) or profile.get("schema") != SCHEMA:
        return None
    if json.dumps(profile.get("key"), sort_keys=True) != json.dumps(key, sort_keys=True):
        return None
    return profile


def recommended_block(pair, target: str, drafter: str, *,
                      root: str | Path | None = None) -> int | None:
    """The autotuned block for this pair on this machine (`dflash2 bench --autotune`), or None
    when no profile matches (other device, mlx version, models or quantization). Not clamped:
    settings.choose_block clamps every recommendation to the trained size, with the reason."""
    try:
        profile = load_profile(profile_key(pair, target, drafter), root)
    except Exception:  # noqa: BLE001 - a profile is an optimisation, never a failure
        return None
    block = profile.get("chosen_block") if profile else None
    if not isinstance(block, int) or isinstance(block, bool) or block < 1:
        return None
    return block
