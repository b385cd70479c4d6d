"""Self-checking kernels and `dflash2 doctor --kernels`.

Each custom kernel checks itself once per process and dtype on first use against its pure-MLX
reference; under `auto` a compile error, launch error or mismatch falls back to the reference
with one warning, under `on` it raises. The kernels run here on the CPU harness
(tests/harness) through the dispatch's launcher seam, and failures are injected through the
same seam: a launcher that returns wrong values, broken kernel sources, and the real Metal
launcher asked to launch where there is no Metal.
"""

from __future__ import annotations

import json
import platform
import re
import warnings
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from harness import runner

from dflash2_cli.app import run
from dflash2_mlx import kernels
from dflash2_mlx.kernels import _references as conv_ref
from dflash2_mlx.kernels import _references as sel_ref
from dflash2_mlx.drafter.selector import CandidateSelector
from dflash2_mlx.kernels import _backend, _checks, _settings

AUTO, ON = _settings.resolve("auto"), _settings.resolve("on")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cpu(tmp_path_factory):
    if runner.find_compiler() is None:
        pytest.skip("no C++ compiler (g++, c++, clang++ or $CXX): CPU kernel harness not run")
    return runner.CpuMetal(tmp_path_factory.getbasetemp() / "metal_harness")


class Counting(runner.HarnessLauncher):
    """The harness, counting launches per kernel; `wrong` kernels return every output + 1."""

    def __init__(self, cpu, wrong=()):
        super().__init__(cpu)
        self.calls, self.wrong = [], set(wrong)

    def __call__(self, launch, source):
        self.calls.append(_checks.label(launch.spec.name))
        outs = super().__call__(launch, source)
        return [o + 1 for o in outs] if self.calls[-1] in self.wrong else outs


def _conv_args(dtype=mx.float32, length=5, hidden=32):
    ks = mx.random.split(mx.random.key(1), 3)
    x = mx.random.normal((2, length, hidden), key=ks[0]).astype(dtype)
    dyn = (0.5 * mx.random.normal((2, length, 2, hidden // 16), key=ks[1])).astype(dtype)
    return x, dyn, mx.random.normal((2, hidden), key=ks[2])


def _lattice(seed=0, lead=(3,)):
    return 3 * mx.random.normal((*lead, 4, 8, 8), key=mx.random.key(seed))


def _fallback_warnings(record):
    return [str(w.message) for w in record if issubclass(w.category, kernels.KernelFallbackWarning)]


def test_each_kernel_checks_itself_once_per_dtype(cpu):
    launcher = Counting(cpu)
    with kernels.override(launcher=launcher, setting=AUTO):
        for dtype in (mx.float32, mx.float32, mx.bfloat16, mx.float32):
            x, dyn, base = _conv_args(dtype)
            got = kernels.dynamic_conv(x, dyn, base, 16)
            ref = conv_ref.dynamic_conv(x, dyn, base, 16)
            np.testing.assert_allclose(
                np.array(got.astype(mx.float32)),
                np.array(ref.astype(mx.float32)),
                rtol=0.05,
                atol=0.05,
            )
        # float32: check + 3 calls; bfloat16: check + 1 call
        assert launcher.calls.count("dynamic_conv") == 6
        lattice = _lattice()
        for _ in range(3):
            assert kernels.walk(lattice, 0.0)[0].tolist() == sel_ref.walk(lattice, 0.0)[0].tolist()
        assert launcher.calls.count("walk_greedy") == 4
        for _ in range(3):
            want = sel_ref.expected_walk(lattice, 1.0)[0].tolist()
            assert kernels.expected_walk_choices(lattice, 1.0).tolist() == want
        assert launcher.calls.count("walk_expected") == 4
        assert kernels.current().failures() == {} and kernels.describe().startswith("metal")


def test_the_check_runs_the_instantiation_the_call_runs(cpu):
    """The conv's GROUP is a template value: a drafter with groups of 32 launched a compiled
    instantiation no check had run (the checks ran groups of 16). Each group is checked with
    itself."""

    class Groups(Counting):
        def __call__(self, launch, source):
            self.calls.append(dict(launch.template)["GROUP"])
            return runner.HarnessLauncher.__call__(self, launch, source)

    launcher = Groups(cpu)
    with kernels.override(launcher=launcher, setting=AUTO):
        for group in (16, 32, 32):
            x, dyn, base = _conv_args(hidden=64)
            dyn = dyn[..., : 64 // group]
            kernels.dynamic_conv(x, dyn, base, group)
    assert launcher.calls == [16, 16, 32, 32, 32]  # a check and the call, per group


@pytest.mark.parametrize("setting", [AUTO, ON], ids=["auto", "on"])
def test_a_wrong_result_falls_back_with_one_warning_or_raises_under_on(cpu, setting):
    launcher = Counting(cpu, wrong={"walk_greedy"})
    selector = CandidateSelector(24, 50, 40, 16)
    selector.walk_calibration = None  # greedy drafts by the stepwise walk: its kernel
    selector.successor_codebook = 0.05 * mx.random.normal((50, 40), key=mx.random.key(3))
    hidden = mx.random.normal((5, 24), key=mx.random.key(4))
    logits = 4 * mx.random.normal((5, 50), key=mx.random.key(5))
    with kernels.override(setting=_settings.resolve("off")):
        want = selector.select(hidden, logits, mx.array(7), 0.0).tokens.tolist()
    with (
        kernels.override(launcher=launcher, setting=setting),
        warnings.catch_warnings(record=True) as record,
    ):
        warnings.simplefilter("always")
        if setting is ON:
            for _ in range(2):  # every call, not only the first
                with pytest.raises(kernels.KernelCheckError, match="walk_greedy .*max abs err"):
                    selector.select(hidden, logits, mx.array(7), 0.0)
            assert not _fallback_warnings(record)
            return
        for seed in range(3):
            lattice = _lattice(seed)
            assert kernels.walk(lattice, 0.0)[0].tolist() == sel_ref.walk(lattice, 0.0)[0].tolist()
        assert selector.select(hidden, logits, mx.array(7), 0.0).tokens.tolist() == want
        messages = _fallback_warnings(record)
        assert len(messages) == 1, messages
        assert "walk_greedy" in messages[0] and "max abs err" in messages[0]
        assert launcher.calls.count("walk_greedy") == 1  # the check only: then the reference
        assert "pair_scores" in launcher.calls  # the other kernels still run
        assert list(kernels.current().failures()) == ["dflash2_walk_greedy"]
        assert "walk_greedy" in kernels.describe()
    assert kernels.current().failures() == {}  # the override's state went with it


def _broken(spec_name, edit):
    def source(spec):
        text = kernels.kernel_source(spec.file)
        return edit(text) if spec.name == spec_name else text

    return source


BROKEN = {
    "compile error": (lambda s: s.replace("prev = best;", "prev = best_index;"), "compile failed"),
    "not MSL": (
        lambda s: s.replace("float temp = temperature;", "double temp = double(temperature);"),
        "double",
    ),
}


@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_a_broken_kernel_source_falls_back_or_raises_under_on(cpu, broken):
    edit, error = BROKEN[broken]
    source = _broken("dflash2_walk_sampled", edit)
    lattice, key = _lattice(7), mx.random.key(8)
    want_picks, want_q = sel_ref.walk(lattice, 0.7, key)
    with (
        kernels.override(launcher=Counting(cpu), setting=AUTO, source=source),
        warnings.catch_warnings(record=True) as record,
    ):
        warnings.simplefilter("always")
        for _ in range(2):
            picks, q = kernels.walk(lattice, 0.7, key)
            assert picks.tolist() == want_picks.tolist() and mx.array_equal(q, want_q)
        messages = _fallback_warnings(record)
        assert len(messages) == 1 and "walk_sampled" in messages[0] and error in messages[0]
    with kernels.override(launcher=Counting(cpu), setting=ON, source=source):
        with pytest.raises(kernels.KernelCheckError, match=f"walk_sampled.*{error}"):
            kernels.walk(lattice, 0.7, key)


class PretendMetal(kernels.MetalLauncher):
    """The real Metal launcher, told that Metal is here: on Linux MLX raises at launch."""

    def unavailable(self):
        return None


@pytest.mark.parametrize("setting", [AUTO, ON], ids=["auto", "on"])
def test_a_launch_error_from_mlx_falls_back_or_raises_under_on(setting):
    if kernels.metal_available():
        pytest.skip("Metal available: the launch succeeds here")
    x, dyn, base = _conv_args()
    with (
        kernels.override(launcher=PretendMetal(), setting=setting),
        warnings.catch_warnings(record=True) as record,
    ):
        warnings.simplefilter("always")
        if setting is ON:
            with pytest.raises(kernels.KernelCheckError, match="No Metal back-end"):
                kernels.dynamic_conv(x, dyn, base, 16)
            return
        for _ in range(2):
            assert mx.array_equal(
                kernels.dynamic_conv(x, dyn, base, 16), conv_ref.dynamic_conv(x, dyn, base, 16)
            )
    messages = _fallback_warnings(record)
    assert len(messages) == 1
    assert "dynamic_conv" in messages[0] and "No Metal back-end" in messages[0]


def test_inputs_under_8_elements_take_the_reference(cpu):
    """MLX gives them another instantiation (constant address space) than the self-check's."""
    launcher = Counting(cpu)
    x, dyn, base = _conv_args(length=1, hidden=16)  # dynamic [2, 1, 2, 1]: 4 elements
    with kernels.override(launcher=launcher, setting=AUTO):
        assert mx.array_equal(
            kernels.dynamic_conv(x, dyn, base, 16), conv_ref.dynamic_conv(x, dyn, base, 16)
        )
        tiny = _lattice(lead=())[:1, :2, :2]  # 4 elements
        assert kernels.walk(tiny, 0.0)[0].tolist() == sel_ref.walk(tiny, 0.0)[0].tolist()
    assert launcher.calls == []


def test_metal_launcher_builds_once_and_launches_on_the_gpu():
    """With a fake mx.fast.metal_kernel: one build per kernel and source, the spec's names, the
    launch plan's grid, and a GPU stream even when the default device is the CPU."""
    built, launched = [], []

    def factory(**spec):
        built.append(spec)
        return lambda **kw: (
            launched.append(kw)
            or [mx.zeros(s, d) for s, d in zip(kw["output_shapes"], kw["output_dtypes"])]
        )

    launcher = kernels.MetalLauncher(factory=factory)
    launch = _checks.case(kernels.SPECS["dflash2_walk_greedy"], (mx.float32,)).launch
    with mx.stream(mx.cpu):
        for _ in range(2):
            launcher(launch, "body")
    launcher(launch, "another body")
    assert [b["source"] for b in built] == ["body", "another body"]
    assert built[0]["name"] == "dflash2_walk_greedy" and built[0]["input_names"] == ["lattice"]
    assert len(launched) == 3
    for kw in launched:
        stream = kw["stream"]
        assert getattr(stream, "device", stream).type == mx.gpu
        assert kw["grid"] == launch.grid and kw["threadgroup"] == launch.threadgroup


def test_mlx_versions_that_collide_kernel_libraries_are_refused():
    assert _backend._version_tuple("0.32.0") < _backend.MIN_MLX
    assert _backend._version_tuple("0.32.1") >= _backend.MIN_MLX
    assert _backend._version_tuple("0.40.0.dev20260101") >= _backend.MIN_MLX
    deps = re.findall(r'"(mlx[^"]*)"', (ROOT / "pyproject.toml").read_text())
    darwin = [d for d in deps if "darwin" in d and not d.startswith("mlx-lm")]
    assert darwin and all(">=0.32.1" in d.replace(" ", "") for d in darwin), darwin


# ----------------------------------------------------------------------------- doctor --kernels
def test_doctor_kernels_says_why_it_cannot_run(capsys):
    if kernels.metal_available():
        pytest.skip("Metal available: the kernels run (see the table test)")
    assert run(["doctor", "--kernels"]) == 0
    out = capsys.readouterr().out
    assert "Custom kernels not run: no Metal back-end" in out
    assert ("on Linux" in out) == (platform.system() == "Linux")
    assert f"mlx {mx.__version__}" in out
    assert run(["doctor", "--kernels", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ran"] is False and report["rows"] == [] and "no Metal" in report["reason"]


def test_doctor_kernels_prints_a_table(cpu, capsys):
    rows_expected = sum(len(v) for v in _checks.DOCTOR_DTYPES.values())
    with kernels.override(launcher=Counting(cpu)):
        assert run(["doctor", "--kernels"]) == 0
        out = capsys.readouterr().out
        assert run(["doctor", "--kernels", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
    assert f"mlx {mx.__version__}" in out and "CPU harness" in out
    assert "| kernel | dtype | shape | max abs err | tolerance | status |" in out
    table = [line for line in out.splitlines() if line.startswith("| ") and "kernel |" not in line]
    assert len(table) == rows_expected and all(line.endswith("| ok |") for line in table)
    for name in ("dynamic_conv", "pair_scores", "walk_greedy", "walk_sampled", "walk_expected"):
        assert any(line.startswith(f"| {name} |") for line in table)
    assert report["ran"] and report["ok"] and len(report["rows"]) == rows_expected
    assert {r["dtype"] for r in report["rows"]} >= {
        "float32",
        "float16",
        "bfloat16",
        "float32/bfloat16",
    }
    for row in report["rows"]:
        assert 0 <= row["max_abs_err"] <= row["tolerance"] and row["error"] == ""


def test_doctor_kernels_reports_a_failing_kernel(cpu, capsys):
    with kernels.override(launcher=Counting(cpu, wrong={"pair_scores"})):
        assert run(["doctor", "--kernels"]) == 1
        out = capsys.readouterr().out
        assert kernels.current().failures() == {}  # doctor checks; it turns nothing off
    failing = [line for line in out.splitlines() if line.endswith("| mismatch |")]
    assert len(failing) == len(_checks.DOCTOR_DTYPES["dflash2_pair_scores"])
    assert all(line.startswith("| pair_scores |") for line in failing)
    assert "pair_scores float32: differs from its reference: max abs err 1" in out
