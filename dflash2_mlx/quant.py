"""What a loaded pair is made of: its quantized matmul layers and weight dtypes (the
autotuner caps quantized targets' blocks and keys its profiles by this signature)."""

from __future__ import annotations

from collections import Counter
from typing import Mapping


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
    return [
        {"kind": k, "bits": b, "group_size": g, "mode": mode, "count": n}
        for (k, b, g, mode), n in sorted(groups.items())
    ]


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
        "drafter": {
            "dtype": weight_dtype(pair.drafter),
            "quantized": quantized_layers(pair.drafter),
        },
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
        parts.append(
            f"{name} {q} ({n} layers), {part.get('dtype')}" if qs else f"{name} {part.get('dtype')}"
        )
    return "; ".join(parts)
