"""Dispatch: the custom Metal kernel where Metal is available, `DFLASH2_KERNELS` allows it and the
shape/dtype is supported; else the pure-MLX reference (dflash2_mlx.drafter.conv / .selector).

Differentiable ops (dynamic_conv, pair_scores) run the kernel forward under `mx.custom_function`
whose VJP is the reference's, so training through them behaves as with the references.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from . import _launch
from ._settings import SETTING, KernelMode, KernelSetting
from ._specs import SPECS, source_location, kernel_source
from ._launch import Launch


@functools.lru_cache(maxsize=1)
def metal_available() -> bool:
    """Metal GPU present and MLX built with custom-kernel support."""
    try:
        return bool(mx.metal.is_available()) and hasattr(mx.fast, "metal_kernel")
    except Exception:  # noqa: BLE001 - an MLX without the metal module
        return False


def kernels_active(setting: KernelSetting | None = None) -> bool:
    """Whether supported calls go to the custom kernels under `setting` (default: SETTING)."""
    setting = SETTING if setting is None else setting
    return setting.mode is not KernelMode.OFF and metal_available()


@functools.lru_cache(maxsize=None)
def _kernel(name: str):
    """Build the `mx.fast.metal_kernel` callable once per kernel (the Metal JIT compiles each
    template instantiation on first use and MLX caches the library)."""
    spec = SPECS[name]
    return mx.fast.metal_kernel(
        name=spec.name, input_names=list(spec.input_names), output_names=list(spec.output_names),
        source=kernel_source(spec.file), header=spec.header,
    )


def execute(launch: Launch) -> list[mx.array]:
    """Run a launch plan on the Metal GPU."""
    return _kernel(launch.spec.name)(**launch.kwargs())


# ----------------------------------------------------------------------------- references
def _ref_conv():
    from ..drafter.conv import dynamic_conv
    return dynamic_conv


def _ref_selector():
    from ..drafter import selector
    return selector


# Without Metal kernels the references run compiled: they are chains of small element-wise ops
# and gathers whose per-op dispatch dominates a draft round on the CPU (measured: the drafter
# forward ~35% faster). Each is a pure function of its array arguments, so compiling is safe.
@functools.lru_cache(maxsize=None)
def _compiled_conv(group_size: int):
    ref = _ref_conv()
    return mx.compile(lambda x, dynamic, base: ref(x, dynamic, base, group_size))


@functools.lru_cache(maxsize=None)
def _compiled_pair_scores():
    return mx.compile(_ref_selector().pair_scores)


@functools.lru_cache(maxsize=64)
def _compiled_walk(temperature: float):
    sel = _ref_selector()
    if temperature <= 0:
        return mx.compile(lambda lattice: sel.walk_with_uniforms(lattice, 0.0, None)[0])
    return mx.compile(lambda lattice, uniforms: sel.walk_with_uniforms(lattice, temperature, uniforms))


def _ref_walk(lattice: mx.array, temperature: float, uniforms: mx.array | None):
    if temperature <= 0:
        return _compiled_walk(0.0)(lattice), None
    return tuple(_compiled_walk(float(temperature))(lattice, uniforms))


# ----------------------------------------------------------------------------- ops
@functools.lru_cache(maxsize=None)
def _conv_fn(group_size: int):
    @mx.custom_function
    def conv(x, dynamic, base):
        return execute(_launch.conv_launch(x, dynamic, base, group_size))[0]

    @conv.vjp
    def conv_vjp(primals, cotangent, output):
        ref = _ref_conv()
        _, grads = mx.vjp(lambda x, d, b: ref(x, d, b, group_size), list(primals), [cotangent])
        return tuple(grads)

    return conv


@mx.custom_function
def _pair_scores_fn(unary, hidden, pred_rows, succ_rows):
    return execute(_launch.pair_scores_launch(unary, hidden, pred_rows, succ_rows))[0]


@_pair_scores_fn.vjp
def _pair_scores_vjp(primals, cotangent, output):
    _, grads = mx.vjp(_ref_selector().pair_scores, list(primals), [cotangent])
    return tuple(grads)


def dynamic_conv(x: mx.array, dynamic: mx.array, base: mx.array, group_size: int) -> mx.array:
    """Same contract as `drafter.conv.dynamic_conv` (x [..., L, H]; dynamic [..., L, T, G];
    base [T, H]); the Metal kernel for two taps and fp32/fp16/bf16 with matching x/dynamic."""
    if kernels_active() and _launch.conv_supported(x, dynamic, base, group_size):
        return _conv_fn(int(group_size))(x, dynamic, base)
    return _compiled_conv(int(group_size))(x, dynamic, base)


def pair_scores(
    unary: mx.array, hidden: mx.array, pred_rows: mx.array, succ_rows: mx.array
) -> mx.array:
    """Same contract as `drafter.selector.pair_scores` ([..., g, P, K] float32)."""
    if (kernels_active()
            and _launch.pair_scores_launch(unary, hidden, pred_rows, succ_rows) is not None):
        return _pair_scores_fn(unary, hidden, pred_rows, succ_rows)
    return _compiled_pair_scores()(unary, hidden, pred_rows, succ_rows)


def walk(lattice: mx.array, temperature: float, key: mx.array | None = None):
    """Same contract as `drafter.selector.walk`: the sampled kernel takes the very uniforms the
    reference draws from `key`, so both paths make the same choices."""
    uniforms = None
    if temperature > 0:
        *lead, gamma, _, k = lattice.shape
        uniforms = _ref_selector().draw_walk_uniforms(tuple(lead), gamma, k, key)
    if kernels_active() and _launch.walk_supported(lattice):
        outs = execute(_launch.walk_launch(lattice, temperature, uniforms))
        return outs[0], (outs[1] if temperature > 0 else None)
    return _ref_walk(lattice, temperature, uniforms)


def walk_with_uniforms(lattice: mx.array, temperature: float, uniforms: mx.array | None):
    """The walk with its sampling noise given (uniforms [..., g, K]; ignored when greedy)."""
    if kernels_active():
        launch = _launch.walk_launch(lattice, temperature, uniforms)
        if launch is not None:
            outs = execute(launch)
            return outs[0], (outs[1] if temperature > 0 else None)
    return _ref_walk(lattice, temperature, uniforms)


# ----------------------------------------------------------------------------- reporting
OPS = ("dynamic_conv", "pair_scores", "walk_greedy", "walk_sampled")


def status(setting: KernelSetting | None = None) -> dict:
    """Which path the ops take, and why."""
    setting = SETTING if setting is None else setting
    metal = metal_available()
    active = kernels_active(setting)
    if setting.mode is KernelMode.OFF:
        reason = "forced by DFLASH2_KERNELS=off"
    elif not metal:
        reason = "Metal unavailable" + (" (DFLASH2_KERNELS=on was asked)"
                                        if setting.mode is KernelMode.ON else "")
    else:
        reason = "Metal available; unsupported shapes/dtypes fall back per call"
    return {
        "path": "metal" if active else "reference",
        "reason": reason,
        "setting": setting.mode.value,
        "setting_note": setting.note,
        "metal": metal,
        "ops": list(OPS),
        "sources": source_location(),
    }


def describe(setting: KernelSetting | None = None) -> str:
    """One line for `dflash2 doctor`."""
    s = status(setting)
    line = f"{s['path']} ({s['reason']}; DFLASH2_KERNELS={s['setting']})"
    return line + (f" [{s['setting_note']}]" if s["setting_note"] else "")
