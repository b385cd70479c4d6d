"""`bench_kernels`: time each custom kernel against its pure-MLX reference."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import mlx.core as mx

from . import _dispatch, _launch
from . import _references as references


def _cases():
    """(op, case label, reference thunk, launch thunk) at the shipped drafter's sizes:
    H = 5120, g = 16, block 16 (15 drafted rows), K = 16, rank 256."""
    k = mx.random.key(0)
    ks = mx.random.split(k, 8)
    hidden, group, length, gamma, top_k, rank = 5120, 16, 16, 15, 16, 256
    out = []
    for dtype in (mx.bfloat16, mx.float32):
        x = mx.random.normal((1, length, hidden), key=ks[0]).astype(dtype)
        dyn = (0.1 * mx.random.normal((1, length, 2, hidden // group), key=ks[1])).astype(dtype)
        base = mx.random.normal((2, hidden), key=ks[2])
        out.append(
            (
                "dynamic_conv",
                f"x[1,{length},{hidden}] {str(dtype).split('.')[-1]} g={group}",
                lambda x=x, d=dyn, b=base: references.dynamic_conv(x, d, b, group),
                lambda x=x, d=dyn, b=base: _launch.conv_launch(x, d, b, group),
            )
        )
    unary = 10 * mx.random.normal((gamma, top_k), key=ks[3])
    h = mx.random.normal((gamma, rank), key=ks[4]).astype(mx.bfloat16)
    pred = (0.1 * mx.random.normal((gamma, top_k, rank), key=ks[5])).astype(mx.bfloat16)
    succ = (0.1 * mx.random.normal((gamma, top_k, rank), key=ks[6])).astype(mx.bfloat16)
    out.append(
        (
            "pair_scores",
            f"g={gamma} K={top_k} r={rank} bf16 rows",
            lambda: references.pair_scores(unary, h, pred, succ),
            lambda: _launch.pair_scores_launch(unary, h, pred, succ),
        )
    )
    return out + _walk_cases(references.pair_scores(unary, h, pred, succ), ks[7])


def _walk_cases(lattice: mx.array, key: mx.array):
    """The walks over one lattice [g, K, K] of the shipped sizes."""
    gamma, _, top_k = lattice.shape
    shape = f"lattice[{gamma},{top_k},{top_k}]"
    uniforms = references.draw_walk_uniforms((), gamma, top_k, key)
    return [
        (
            "walk_greedy",
            shape,
            lambda: references.walk_with_uniforms(lattice, 0.0, None)[0],
            lambda: _launch.walk_launch(lattice, 0.0),
        ),
        (
            "walk_sampled",
            f"{shape} T=1 (given uniforms)",
            lambda: references.walk_with_uniforms(lattice, 1.0, uniforms),
            lambda: _launch.walk_launch(lattice, 1.0, uniforms),
        ),
        (
            "walk_expected",
            f"{shape} calibration 1",
            lambda: references.expected_walk(lattice, 1.0),
            lambda: _launch.expected_walk_launch(lattice, 1.0),
        ),
    ]


def _time(fn: Callable, repeats: int, warmup: int) -> tuple[float, object]:
    result = None
    for _ in range(warmup):
        result = fn()
        mx.eval(result)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        mx.eval(result)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), result


def _max_diff(a, b) -> float:
    a = a if isinstance(a, (list, tuple)) else [a]
    b = b if isinstance(b, (list, tuple)) else [b]
    diffs = [
        float(mx.max(mx.abs(x.astype(mx.float32) - y.astype(mx.float32))).item())
        for x, y in zip(a, b)
        if x is not None and y is not None
    ]
    return max(diffs) if diffs else 0.0


def bench_kernels(repeats: int = 20, warmup: int = 3) -> dict:
    """Median wall time (ms, evaluated) per op: the custom Metal kernel against its pure-MLX
    reference where Metal exists; elsewhere the references only, with `kernels_run` False.

    Returns {"metal", "kernels_run", "setting", "note", "repeats", "results": [{"op", "case",
    "reference_ms", "kernel_ms", "speedup", "max_abs_diff"}]}. The kernels are timed whenever
    Metal exists, whatever DFLASH2_KERNELS says (the setting is reported)."""
    repeats = max(1, int(repeats))
    metal = _dispatch.metal_available()
    results = []
    for op, case, ref, plan in _cases():
        ref_ms, ref_out = _time(ref, repeats, warmup)
        row = {
            "op": op,
            "case": case,
            "reference_ms": round(ref_ms, 4),
            "kernel_ms": None,
            "speedup": None,
            "max_abs_diff": None,
        }
        if metal:
            k_ms, k_out = _time(lambda: _dispatch.execute(plan()), repeats, warmup)
            if op == "walk_greedy":
                k_out = k_out[:1]
            row.update(
                kernel_ms=round(k_ms, 4),
                speedup=round(ref_ms / k_ms, 3) if k_ms else None,
                max_abs_diff=_max_diff(
                    list(k_out), list(ref_out) if isinstance(ref_out, tuple) else [ref_out]
                ),
            )
        results.append(row)
    note = (
        "custom Metal kernels timed against the pure-MLX references"
        if metal
        else "Metal unavailable: the custom kernels were not run; reference timings only "
        "(they are checked on this machine by the CPU harness in tests/test_kernels.py)"
    )
    setting = _dispatch.current().setting.mode.value
    return {
        "metal": metal,
        "kernels_run": metal,
        "setting": setting,
        "note": note,
        "repeats": repeats,
        "device": str(mx.default_device()),
        "results": results,
    }
