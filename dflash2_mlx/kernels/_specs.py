"""The custom kernels: where each body lives and how MLX is to name its parameters.

A body in `metal/<file>` is the inside of a Metal function; `mx.fast.metal_kernel` generates the
signature from `input_names` (plus `<name>_shape` / `_strides` / `_ndim` when the body mentions
them), `output_names`, the call's dtypes and template arguments. The CPU harness in tests/harness
generates the same signature, so the names here are the single source of truth for both.

Sources are package data of `dflash2_mlx.kernels.metal`: the repository's `metal/` directory,
mapped into the package by pyproject.toml (for wheels and editable installs alike), and read
through importlib.resources only.
"""

from __future__ import annotations

import functools
import importlib.resources
from dataclasses import dataclass

SOURCE_PACKAGE = "dflash2_mlx.kernels.metal"


@dataclass(frozen=True)
class KernelSpec:
    name: str  # mx.fast.metal_kernel name (MLX prefixes "custom_kernel_" and a type suffix)
    file: str  # body file under metal/
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    # In the order the launch passes them. Dtype templates also key the compiled kernel's name
    # per dtype combination (older MLX named custom kernels by their template only).
    template_names: tuple[str, ...] = ()
    header: str = ""


DYNAMIC_CONV = KernelSpec(
    "dflash2_dynamic_conv", "dynamic_conv.metal", ("x", "dynamic", "base"), ("out",), ("T", "GROUP")
)
PAIR_SCORES = KernelSpec(
    "dflash2_pair_scores",
    "pair_scores.metal",
    ("unary", "hidden", "pred_rows", "succ_rows"),
    ("scores",),
    ("TU", "TH", "TP", "TS"),
)
WALK_GREEDY = KernelSpec("dflash2_walk_greedy", "walk_greedy.metal", ("lattice",), ("choices",))
WALK_SAMPLED = KernelSpec(
    "dflash2_walk_sampled",
    "walk_sampled.metal",
    ("lattice", "uniforms", "temperature"),
    ("choices", "q"),
)
WALK_EXPECTED = KernelSpec(
    "dflash2_walk_expected",
    "walk_expected.metal",
    ("lattice", "calibration"),
    ("choices", "values"),  # values: the backward pass's V_t(a), its scratch too
)
SPECS: dict[str, KernelSpec] = {
    s.name: s for s in (DYNAMIC_CONV, PAIR_SCORES, WALK_GREEDY, WALK_SAMPLED, WALK_EXPECTED)
}


def source_location() -> str:
    """Where the bodies are read from (the package data folder)."""
    return str(importlib.resources.files(SOURCE_PACKAGE))


@functools.lru_cache(maxsize=None)
def kernel_source(file: str) -> str:
    """The text of metal/<file>, from the package data of SOURCE_PACKAGE."""
    try:
        return (importlib.resources.files(SOURCE_PACKAGE) / file).read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise FileNotFoundError(
            f"Metal kernel source {file!r} not found in package {SOURCE_PACKAGE} ({exc}); "
            "is dflash2 installed (pip install -e . or pip install .)?"
        ) from None
