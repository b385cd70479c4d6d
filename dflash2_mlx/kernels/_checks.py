"""Self-checks: each kernel on a small fixed input of given dtypes against its pure-MLX
reference, with a tolerance. The dispatch runs one per kernel and dtype combination on first
use; `dflash2 doctor --kernels` runs them all.

Every array input of a check has at least 8 elements, so the check compiles and runs the same
instantiation (address spaces, dtypes, template) as the calls it vouches for.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

import mlx.core as mx

from . import _launch
from . import _references as ref
from ._launch import Launch
from ._specs import DYNAMIC_CONV, PAIR_SCORES, WALK_EXPECTED, WALK_GREEDY, WALK_SAMPLED, KernelSpec

_EPS = {mx.float32: 2.0**-23, mx.float16: 2.0**-10, mx.bfloat16: 2.0**-7}
F32 = mx.float32


@dataclass(frozen=True)
class Case:
    kernel: str
    dtype: str
    shape: str
    launch: Launch
    reference: Callable[[], list[mx.array]]  # the reference's outputs, in the kernel's order
    tolerance: Callable[[], float]  # bound on the max abs difference over all outputs


@dataclass(frozen=True)
class CheckResult:
    kernel: str
    dtype: str
    shape: str
    max_abs_err: float | None  # None when the kernel did not run
    tolerance: float | None
    status: str  # "ok" | "mismatch" | "error"
    error: str = ""  # what went wrong (empty when ok)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def describe(self) -> str:
        return f"{self.kernel} ({self.dtype}, {self.shape}): {self.error or self.status}"

    def to_dict(self) -> dict:
        return asdict(self)


def label(name: str) -> str:
    """A kernel's short name (dynamic_conv, pair_scores, walk_greedy, walk_sampled,
    walk_expected)."""
    return name.removeprefix("dflash2_")


def dtype_label(dtypes) -> str:
    names = [str(d).split(".")[-1] for d in dtypes]
    return "/".join(dict.fromkeys(names))  # one name when all agree, else each, in order


def _normal(shape, seed: int, dtype=F32, scale: float = 1.0) -> mx.array:
    return (scale * mx.random.normal(shape, key=mx.random.key(seed))).astype(dtype)


def _max(a: mx.array) -> float:
    return float(mx.max(a).item())


def _conv_case(dtypes, template=()) -> Case:
    """With the call's GROUP (16 unless given): its instantiation is the one checked."""
    dtype, group = dtypes[0], dict(template).get("GROUP", 16)
    x = _normal((2, 3, 2 * group), 1, dtype)
    dyn = _normal((2, 3, 2, 2), 2, dtype, 0.5)
    base = _normal((2, 2 * group), 3, dtype)

    # Arithmetic in float rounded once (kernel) vs several roundings in the dtype (reference).
    def mag():
        return ref.dynamic_conv(
            mx.abs(x).astype(F32), mx.abs(dyn).astype(F32), mx.abs(base).astype(F32), group
        )

    return Case(
        label(DYNAMIC_CONV.name),
        dtype_label([dtype]),
        f"x[2,3,{2 * group}] g={group}",
        _launch.conv_launch(x, dyn, base, group),
        lambda: [ref.dynamic_conv(x, dyn, base, group)],
        lambda: 4 * _EPS[dtype] * _max(mag()) + 1e-6,
    )


def _pair_scores_case(dtypes) -> Case:
    lead, preds, k, rank = (3,), 4, 4, 8
    args = (
        _normal((*lead, k), 4, dtypes[0]),
        _normal((*lead, rank), 5, dtypes[1]),
        _normal((*lead, preds, rank), 6, dtypes[2], 0.3),
        _normal((*lead, k, rank), 7, dtypes[3], 0.3),
    )

    def scale():
        return ref.pair_scores(*(mx.abs(a.astype(F32)) for a in args))

    return Case(
        label(PAIR_SCORES.name),
        dtype_label(dtypes),
        f"g=3 P={preds} K={k} r={rank}",
        _launch.pair_scores_launch(*args),
        lambda: [ref.pair_scores(*args)],
        lambda: 1e-5 * _max(scale()) + 1e-6,
    )


def _walk_lattice() -> mx.array:
    """[2, 4, 8, 8]: walk 0 starts on a row of only NaN and -inf (picks 0); walk 1's first row
    holds a NaN and a tie for the maximum (the lowest index wins)."""
    lattice = _normal((2, 4, 8, 8), 8, scale=3.0)
    nan, inf = float("nan"), float("inf")
    lattice[0, 0, 0] = mx.array([nan, -inf, -inf, nan, -inf, -inf, -inf, -inf])
    lattice[1, 0, 0, 1] = nan
    lattice[1, 0, 0, 5] = 50.0
    lattice[1, 0, 0, 6] = 50.0
    return lattice


def _walk_greedy_case(dtypes) -> Case:
    lattice = _walk_lattice()
    return Case(
        label(WALK_GREEDY.name),
        "float32",
        "lattice[2,4,8,8] NaN, ties",
        _launch.walk_launch(lattice, 0.0),
        lambda: [ref.walk_with_uniforms(lattice, 0.0, None)[0]],
        lambda: 0.0,
    )


def _walk_sampled_case(dtypes) -> Case:
    lattice = _normal((2, 4, 8, 8), 9, scale=3.0)
    uniforms = ref.draw_walk_uniforms((2,), 4, 8, mx.random.key(10))
    return Case(
        label(WALK_SAMPLED.name),
        "float32",
        "lattice[2,4,8,8] T=0.7",
        _launch.walk_launch(lattice, 0.7, uniforms),
        lambda: list(ref.walk_with_uniforms(lattice, 0.7, uniforms)),
        lambda: 1e-5,
    )  # q in [0, 1]; the choices must be equal (an error of >= 1)


def expected_walk_lattice() -> mx.array:
    """[3, 4, 8, 8]: walk 0 starts on a row of only NaN and -inf (NaN values, picks 0); walk 1
    ties at step 0 (equal scores, then equal rows: equal gains, 5 wins over 6); walk 2 has a NaN
    in its last step's row 3 (every earlier value NaN, steps 0 and 1 pick 0) and at step 2 a
    row whose best score is that 3 (skipped: a NaN gain) and whose last four are -inf."""
    lattice = _normal((3, 4, 8, 8), 11, scale=3.0)
    nan, inf = float("nan"), float("inf")
    lattice[0, 0, 0] = mx.array([nan, -inf, -inf, nan, -inf, -inf, -inf, -inf])
    lattice[1, 0, 0, 5] = 50.0
    lattice[1, 0, 0, 6] = 50.0
    lattice[1, 1, 6] = lattice[1, 1, 5]
    lattice[2, 3, 3, 1] = nan
    lattice[2, 2, 0, 3] = 9.0
    lattice[2, 2, 0, 4:] = -inf
    return lattice


def _walk_expected_case(dtypes) -> Case:
    lattice = expected_walk_lattice()
    return Case(
        label(WALK_EXPECTED.name),
        "float32",
        "lattice[3,4,8,8] NaN, -inf, ties",
        _launch.expected_walk_launch(lattice, 1.0),
        lambda: list(ref.expected_walk(lattice, 1.0)),
        lambda: 4e-5,
    )  # values in [0, 4] (4 steps), within 1e-5 a step; the choices must be equal


_BUILDERS: dict[str, Callable[[tuple], Case]] = {
    DYNAMIC_CONV.name: _conv_case,
    PAIR_SCORES.name: _pair_scores_case,
    WALK_GREEDY.name: _walk_greedy_case,
    WALK_SAMPLED.name: _walk_sampled_case,
    WALK_EXPECTED.name: _walk_expected_case,
}

# What `doctor --kernels` checks: each kernel's supported dtypes, and the mixed pair-score
# inputs of a bf16 drafter with fp32 logits.
_HALF = (mx.float16, mx.bfloat16)
DOCTOR_DTYPES: dict[str, list[tuple]] = {
    DYNAMIC_CONV.name: [(d,) * 3 for d in (F32, *_HALF)],
    PAIR_SCORES.name: [(d,) * 4 for d in (F32, *_HALF)] + [(F32,) + (mx.bfloat16,) * 3],
    WALK_GREEDY.name: [(F32,)],
    WALK_SAMPLED.name: [(F32,) * 3],
    WALK_EXPECTED.name: [(F32,) * 2],
}


def case(spec: KernelSpec, dtypes, template: tuple = ()) -> Case:
    """The check of `spec` for launch inputs of `dtypes` and its `template` values (the conv's
    GROUP): the dispatch's cache key."""
    build = _BUILDERS[spec.name]
    return build(tuple(dtypes), tuple(template)) if template else build(tuple(dtypes))


def max_abs_err(got: list[mx.array], want: list[mx.array]) -> float:
    """Largest |got - want| over all outputs, in float32; NaN where both are NaN counts as
    equal, NaN against a number (or a shape / dtype difference) as infinite."""
    if len(got) != len(want):
        return math.inf
    worst = 0.0
    for g, w in zip(got, want):
        if tuple(g.shape) != tuple(w.shape) or g.dtype != w.dtype:
            return math.inf
        g, w = g.astype(F32), w.astype(F32)
        diff = mx.where(mx.isnan(g) & mx.isnan(w), 0.0, mx.abs(g - w))
        worst = max(worst, _max(mx.where(mx.isnan(diff), math.inf, diff)) if diff.size else 0.0)
    return worst


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    text = text if len(text) <= limit else text[:limit] + " ..."
    return f"{type(exc).__name__}: {text}"


def run(check: Case, execute: Callable[[Launch], list[mx.array]]) -> CheckResult:
    """Run one check: `execute` launches the kernel (a compile or launch error is caught)."""
    where = dict(kernel=check.kernel, dtype=check.dtype, shape=check.shape)
    try:
        got = list(execute(check.launch))
        mx.eval(got)
    except Exception as exc:  # noqa: BLE001 - whatever the kernel raised is the finding
        return CheckResult(
            **where, max_abs_err=None, tolerance=None, status="error", error=_short(exc)
        )
    want = check.reference()
    mx.eval(want)
    err, tol = max_abs_err(got, want), float(check.tolerance())
    if err <= tol:
        return CheckResult(**where, max_abs_err=err, tolerance=tol, status="ok")
    return CheckResult(
        **where,
        max_abs_err=err,
        tolerance=tol,
        status="mismatch",
        error=f"differs from its reference: max abs err {err:.3g} > tolerance {tol:.3g}",
    )
