"""The selector's walks (greedy, sampled, expected) as Metal kernels against their pure-MLX
references, on the executors of kernel_exec.py (the CPU harness everywhere, Metal on a Mac)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from kernel_exec import lattice

from dflash2_mlx.kernels import _checks, _launch
from dflash2_mlx.kernels import _references as sel_ref
from dflash2_mlx.kernels import _references as _reference

WALK_SHAPES = [((), 15, 16), ((), 1, 16), ((), 4, 5), ((3,), 6, 16), ((2, 2), 3, 7)]


def test_greedy_walk_matches_reference(run_kernel):
    lattices = [lattice(lead, g, k, seed=20 + i) for i, (lead, g, k) in enumerate(WALK_SHAPES)]
    lattices.append(lattice((), 8, 16, seed=30, scale=1e4))  # large logits
    ties = mx.zeros((5, 16, 16))  # all tied: the lowest index, every step
    ties = ties.at[2, 0, 3].add(1.0).at[2, 0, 9].add(1.0)  # a two-way tie at step 2
    lattices.append(ties)
    for lat in lattices:
        got = run_kernel(_launch.walk_launch(lat, 0.0))
        want, q = sel_ref.walk(lat, 0.0)
        assert len(got) == 1 and q is None
        assert got[0].dtype == mx.int32 and got[0].tolist() == want.tolist()
    assert run_kernel(_launch.walk_launch(ties, 0.0))[0].tolist() == [0, 0, 3, 0, 0]


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_sampled_walk_matches_reference(run_kernel, temperature):
    cases = [lattice(lead, g, k, seed=40 + i) for i, (lead, g, k) in enumerate(WALK_SHAPES)]
    cases.append(lattice((2,), 8, 16, seed=49, scale=1e4))  # large logits: near one-hot q
    for i, lat in enumerate(cases):
        *lead, gamma, _, k = lat.shape
        key = mx.random.key(100 + i)
        uniforms = _reference.draw_walk_uniforms(tuple(lead), gamma, k, key)
        picks, q = run_kernel(_launch.walk_launch(lat, temperature, uniforms))
        want_picks, want_q = _reference.walk_with_uniforms(lat, temperature, uniforms)
        assert picks.dtype == mx.int32 and picks.tolist() == want_picks.tolist()
        assert q.shape == want_q.shape and np.all(np.isfinite(np.array(q)))
        np.testing.assert_allclose(np.array(q), np.array(want_q), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.array(q.sum(-1)), 1.0, rtol=1e-5)


def test_sampled_walk_draws_from_q(run_kernel):
    """Many independent walks of one lattice: step 0's choices follow q (5 sigma), and step 1
    follows the row of the step-0 choice."""
    n, k = 6000, 5
    one = mx.array(
        [
            [[1.0, 0.0, -1.0, 2.0, 0.5]] * k,
            [[0.0, 3.0, 0.0, 0.0, 0.0], [2.0, 2.0, 0.0, 0.0, -9.0]] + [[0.0] * k] * 3,
        ]
    )
    lat = mx.broadcast_to(one, (n, 2, k, k))
    uniforms = _reference.draw_walk_uniforms((n,), 2, k, mx.random.key(0))
    picks, q = run_kernel(_launch.walk_launch(lat, 1.0, uniforms))
    picks, q = np.array(picks), np.array(q)
    p0 = q[0, 0]
    np.testing.assert_allclose(p0, np.exp(one[0, 0]) / np.exp(one[0, 0]).sum(), rtol=1e-6)
    freq = np.bincount(picks[:, 0], minlength=k) / n
    assert np.all(np.abs(freq - p0) <= 5 * np.sqrt(p0 * (1 - p0) / n) + 1e-9), (freq, p0)
    for prev in (0, 1):
        sel = picks[:, 0] == prev
        row = np.array(one[1, prev])
        p1 = np.exp(row) / np.exp(row).sum()
        np.testing.assert_allclose(q[sel, 1], np.broadcast_to(p1, (sel.sum(), k)), rtol=1e-6)
        f1 = np.bincount(picks[sel, 1], minlength=k) / sel.sum()
        assert np.all(np.abs(f1 - p1) <= 5 * np.sqrt(p1 * (1 - p1) / sel.sum()) + 1e-9)


def test_walk_uniforms_follow_the_reference_keys():
    """Pure MLX. _references.walk is the walk over uniforms drawn from its key: same picks and q,
    greedy and sampled, single and batched; the global PRNG advances the same way (key None)."""
    for i, (lead, gamma, k) in enumerate(WALK_SHAPES + [((4,), 5, 16)]):
        lat = lattice(lead, gamma, k, seed=60 + i)
        key = mx.random.key(i)
        uniforms = _reference.draw_walk_uniforms(tuple(lead), gamma, k, key)
        assert (
            sel_ref.walk(lat, 0.0)[0].tolist()
            == _reference.walk_with_uniforms(lat, 0.0, None)[0].tolist()
        )
        want = sel_ref.walk(lat, 0.7, key)
        got = _reference.walk_with_uniforms(lat, 0.7, uniforms)
        assert got[0].tolist() == want[0].tolist() and mx.array_equal(got[1], want[1])
        mx.random.seed(7)
        sel_ref.walk(lat, 1.0, None)
        after_ref = mx.random.uniform(shape=(3,))
        mx.random.seed(7)
        _reference.draw_walk_uniforms(tuple(lead), gamma, k, None)
        assert mx.array_equal(mx.random.uniform(shape=(3,)), after_ref)


def _nan_lattice(seed):
    """Three walks whose first rows hold NaN: only NaN / -inf (-> 0), NaN beside a tie for
    the maximum (-> 2, the lower index), NaN before +inf (-> 5)."""
    nan, inf = float("nan"), float("inf")
    lat = lattice((3,), 4, 6, seed=seed)
    lat[0, 0, 0] = mx.array([nan, -inf, nan, -inf, -inf, -inf])
    lat[1, 0, 0] = mx.array([1.0, nan, 5.0, 5.0, nan, 2.0])
    lat[2, 0, 0] = mx.array([nan, 1.0, 2.0, nan, 3.0, inf])
    return lat


def test_walks_never_choose_nan(run_kernel):
    """NaN never wins the argmax of either walk (as Metal's mx.argmax: from -inf with a strict
    `>`; the reference masks NaN, since CPU's mx.argmax picks the first NaN), ties go to the
    lowest index and a row of only NaN / -inf picks 0: kernel and reference agree."""
    lat = _nan_lattice(70)
    got = run_kernel(_launch.walk_launch(lat, 0.0))[0]
    assert got.tolist() == sel_ref.walk(lat, 0.0)[0].tolist()
    assert got[:, 0].tolist() == [0, 2, 5]
    for temperature in (0.5, 1.0):
        uniforms = _reference.draw_walk_uniforms((3,), 4, 6, mx.random.key(71))
        picks, q = run_kernel(_launch.walk_launch(lat, temperature, uniforms))
        want_picks, want_q = _reference.walk_with_uniforms(lat, temperature, uniforms)
        assert picks.tolist() == want_picks.tolist()
        assert picks[0, 0].item() == 0 and picks[1, 0].item() not in (1, 4)
        q, want_q = np.array(q), np.array(want_q)
        assert np.isnan(q[:, 0]).all() and np.isnan(want_q[:, 0]).all()  # softmax of a NaN row
        np.testing.assert_allclose(q, want_q, rtol=1e-5, atol=1e-6)  # NaN where the other is


# ----------------------------------------------------------------------------- expected walk
def _expected_walk_lattices():
    lattices = [lattice(lead, g, k, seed=80 + i) for i, (lead, g, k) in enumerate(WALK_SHAPES)]
    lattices.append(lattice((), 8, 16, seed=86, scale=1e4))  # large logits: one-hot p
    lattices.append(3 * mx.random.normal((2, 3, 8, 5), key=mx.random.key(87)))  # P > K
    return lattices


@pytest.mark.parametrize("calibration", [0.5, 1.0, 1.5])
def test_expected_walk_matches_reference(run_kernel, calibration):
    """Same choices as the reference, and the values V_t(a) of every step and row (step 0's
    rows a > 0 included) within float32 rounding."""
    for lat in _expected_walk_lattices():
        choices, values = run_kernel(_launch.expected_walk_launch(lat, calibration))
        want_choices, want_values = sel_ref.expected_walk(lat, calibration)
        assert choices.dtype == mx.int32 and choices.tolist() == want_choices.tolist()
        assert values.dtype == mx.float32 and values.shape == want_values.shape == lat.shape[:-1]
        assert np.all(np.isfinite(np.array(values)))
        np.testing.assert_allclose(np.array(values), np.array(want_values), rtol=1e-5, atol=1e-6)


def test_expected_walk_ties_go_to_the_lowest_index(run_kernel):
    flat = mx.zeros((5, 16, 16))  # every gain of a row equal: 0, every step
    tie = lattice((), 3, 8, seed=88)
    tie[0, 0, 2] = 40.0
    tie[0, 0, 6] = 40.0
    tie[1, 6] = tie[1, 2]  # equal rows after them: equal values, so equal gains at step 0
    for lat, first in ((flat, [0] * 5), (tie, [2])):
        choices, values = run_kernel(_launch.expected_walk_launch(lat, 1.0))
        want_choices, want_values = sel_ref.expected_walk(lat, 1.0)
        assert choices.tolist() == want_choices.tolist()
        assert choices.tolist()[: len(first)] == first
        np.testing.assert_allclose(np.array(values), np.array(want_values), rtol=1e-5, atol=1e-6)


def test_expected_walk_nan_and_inf_as_the_reference(run_kernel):
    """A row holding NaN (or only -inf, or +inf) has NaN probabilities; a NaN gain is never
    chosen and makes its value NaN, so NaN runs back to every earlier step; kernel and
    reference agree on the choices and on where the values are NaN."""
    inf = float("inf")
    nan_rows = _nan_lattice(72)  # step 0 rows with NaN / -inf / +inf: every walk picks 0
    nan_rows[0, 2, 1] = mx.full((6,), -inf)  # a later row of only -inf
    lattices = [_checks.expected_walk_lattice(), nan_rows]
    for lat in lattices:
        choices, values = run_kernel(_launch.expected_walk_launch(lat, 1.0))
        want_choices, want_values = sel_ref.expected_walk(lat, 1.0)
        assert choices.tolist() == want_choices.tolist()
        v, want_v = np.array(values), np.array(want_values)
        assert np.array_equal(np.isnan(v), np.isnan(want_v))
        np.testing.assert_allclose(v, want_v, rtol=1e-5, atol=1e-6)  # NaN where the other is
    checked = run_kernel(_launch.expected_walk_launch(lattices[0], 1.0))
    c, v = checked[0].tolist(), np.array(checked[1])
    assert c[0][0] == 0 and c[1][0] == 5 and c[2][:2] == [0, 0] and c[2][2] in (0, 1, 2)
    assert np.isnan(v[0, 0, 0]) and not np.isnan(v[0, 0, 1:]).any()
    assert np.isnan(v[2, :3]).all() and np.isnan(v[2, 3, 3]) and not np.isnan(v[2, 3, :3]).any()
    nan_picks, nan_values = run_kernel(_launch.expected_walk_launch(nan_rows, 1.0))
    nv = np.array(nan_values)
    assert nan_picks[:, 0].tolist() == [0, 0, 0] and np.isnan(nv[:, 0, 0]).all()
    assert np.isnan(nv[0, 2]).tolist() == [False, True] + [False] * 4  # the -inf row
    assert np.isnan(nv[0, :2]).all()  # ... runs back to every earlier step
