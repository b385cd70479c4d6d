"""Run Metal kernel bodies on the CPU: lint the body as MSL (msl_lint.py), generate the source
MLX would (signature.py), compile it as C++14 against metal_shim.h, and call the kernel once per
work item over the whole grid through a generated `extern "C"` entry point (ctypes).

Buffers are passed row-contiguous (as `ensure_row_contiguous=True` guarantees on Metal) inside
guard zones: input guards hold NaN bit patterns (an out-of-bounds read poisons the result), output
buffers and guards start as 0xFF bytes (NaN / -1: an element never written shows up; a write out
of bounds is reported).
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from . import msl_lint, signature

HERE = Path(__file__).resolve().parent
GUARD = 64  # elements of guard zone on each side of every buffer
MAX_THREADS_PER_THREADGROUP = 1024  # Metal's limit on every Apple GPU

# Work-item attributes the loop provides (expressions over x, y, z, the grid g and group t).
# Not modelled (NotModelled is raised): SIMD/quad indices, thread_index_in_threadgroup and
# threads_per_threadgroup (their values in partial threadgroups are not pinned down here).
MODELLED_ATTRIBUTES = {
    "thread_position_in_grid": "uint3{x, y, z}",
    "threads_per_grid": "g",
    "grid_size": "g",
    "grid_origin": "uint3{0u, 0u, 0u}",
    "thread_position_in_threadgroup": "uint3{x % t.x, y % t.y, z % t.z}",
    "threadgroup_position_in_grid": "uint3{x / t.x, y / t.y, z / t.z}",
}

_NUMPY = {
    mx.float32: np.float32,
    mx.float16: np.float16,
    mx.bfloat16: np.uint16,
    mx.int32: np.int32,
    mx.uint32: np.uint32,
    mx.int64: np.int64,
    mx.uint64: np.uint64,
    mx.int16: np.int16,
    mx.uint16: np.uint16,
    mx.int8: np.int8,
    mx.uint8: np.uint8,
    mx.bool_: np.bool_,
}


class NotModelled(Exception):
    """The body uses something metal_shim.h / the loop does not model."""


class MslViolation(Exception):
    """The body uses something C++ accepts and Metal does not (see msl_lint.py)."""


def find_compiler() -> str | None:
    for cand in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


def to_numpy(a: mx.array) -> np.ndarray:
    """Host copy, row-contiguous; bfloat16 travels as its uint16 bit pattern."""
    if a.dtype == mx.bfloat16:
        return np.ascontiguousarray(np.array(a.view(mx.uint16)))
    return np.ascontiguousarray(np.array(a))


def from_numpy(a: np.ndarray, dtype: mx.Dtype) -> mx.array:
    if dtype == mx.bfloat16:
        return mx.array(a).view(mx.bfloat16)
    return mx.array(a)


def _guarded(n: int, np_dtype, fill_byte: int) -> tuple[np.ndarray, np.ndarray]:
    """(whole buffer with guards, the view of its n payload elements)."""
    whole = np.empty(n + 2 * GUARD, dtype=np_dtype)
    whole.view(np.uint8)[:] = fill_byte
    return whole, whole[GUARD : GUARD + n]


@dataclass
class CompiledKernel:
    generated: signature.Generated
    library: ctypes.CDLL
    entry: object


class CpuMetal:
    """Compiles (cached by source) and runs kernel bodies on the CPU."""

    def __init__(self, build_dir: Path, compiler: str | None = None):
        self.build_dir = Path(build_dir)
        self.build_dir.mkdir(parents=True, exist_ok=True)
        self.compiler = compiler or find_compiler()
        if self.compiler is None:
            raise RuntimeError("no C++ compiler found (g++, c++, clang++ or $CXX)")
        self._cache: dict[str, CompiledKernel] = {}
        self.compiles = 0
        version = subprocess.run([self.compiler, "--version"], capture_output=True, text=True)
        self.is_clang = "clang" in (version.stdout + version.stderr).lower()

    # ------------------------------------------------------------------ build
    def _driver(self, gen: signature.Generated) -> str:
        args = []
        for p in gen.params:
            if p.kind == "attribute":
                if p.name not in MODELLED_ATTRIBUTES:
                    raise NotModelled(f"attribute {p.name} is not modelled by the harness")
                args.append(MODELLED_ATTRIBUTES[p.name])
            elif p.kind == "input":
                args.append(f"static_cast<const {p.ctype}*>(a[{p.index}])")
            elif p.kind == "scalar":
                args.append(f"*static_cast<const {p.ctype}*>(a[{p.index}])")
            elif p.kind == "shape":
                args.append(f"static_cast<const int*>(a[{p.index}])")
            elif p.kind == "strides":
                args.append(f"static_cast<const int64_t*>(a[{p.index}])")
            elif p.kind == "ndim":
                args.append(f"*static_cast<const int*>(a[{p.index}])")
            elif p.kind == "output":
                args.append(f"static_cast<{p.ctype}*>(a[{p.index}])")
        call = gen.kernel_name + gen.template_def
        joined = ",\n          ".join(args)
        return (
            '\nextern "C" void dflash2_harness_run(void* const* a, const unsigned* grid,\n'
            "                                    const unsigned* group) {\n"
            "  const uint3 g{grid[0], grid[1], grid[2]};\n"
            "  const uint3 t{group[0], group[1], group[2]};\n"
            "  (void)t;\n"
            "  for (uint z = 0; z < g.z; ++z)\n"
            "    for (uint y = 0; y < g.y; ++y)\n"
            "      for (uint x = 0; x < g.x; ++x)\n"
            f"        {call}(\n          {joined});\n"
            "}\n"
        )

    def _flags(self) -> list[str]:
        common = [
            "-std=c++14",
            "-pedantic-errors",
            "-O1",
            "-shared",
            "-fPIC",
            "-ffp-contract=off",
            "-Wall",
        ]
        if self.is_clang:  # e.g. Xcode's: Metal attributes are unknown attributes there
            return common + ["-Wno-unknown-attributes", "-Wno-ignored-attributes"]
        return common + ["-Werror", "-Wno-attributes"]

    def build(self, gen: signature.Generated) -> CompiledKernel:
        source = gen.source
        if self.is_clang:
            # The [[host_name]] explicit instantiation is checked with g++ only; the driver's
            # call instantiates the template anyway.
            source = source.split("\ntemplate [[host_name(")[0]
        text = '#include "metal_shim.h"\n' + source + self._driver(gen)
        shim = (HERE / "metal_shim.h").read_text()
        digest = hashlib.sha256("\0".join([text, shim, *self._flags()]).encode()).hexdigest()[:16]
        if digest in self._cache:
            return self._cache[digest]
        src = self.build_dir / f"{gen.kernel_name}_{digest}.cpp"
        lib = src.with_suffix(".so")
        if not lib.exists():  # a build directory shared by test modules keeps its libraries
            src.write_text(text)
            cmd = [self.compiler, *self._flags(), f"-I{HERE}", str(src), "-o", str(lib)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"harness compile failed ({' '.join(cmd)}):\n{proc.stderr}")
            self.compiles += 1
        library = ctypes.CDLL(str(lib))
        entry = library.dflash2_harness_run
        entry.restype = None
        entry.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_uint),
            ctypes.POINTER(ctypes.c_uint),
        ]
        compiled = CompiledKernel(gen, library, entry)
        self._cache[digest] = compiled
        return compiled

    # ------------------------------------------------------------------ run
    def run(
        self,
        name: str,
        input_names,
        output_names,
        source: str,
        inputs: list[mx.array],
        output_shapes,
        output_dtypes,
        grid,
        threadgroup,
        template=(),
        header: str = "",
    ) -> list[mx.array]:
        problems = msl_lint.lint(header + "\n" + source, [n for n, _ in template])
        if problems:
            raise MslViolation(f"{name}: not valid MSL:\n  " + "\n  ".join(problems))
        if (
            any(int(t) < 1 for t in threadgroup)
            or math.prod(int(t) for t in threadgroup) > MAX_THREADS_PER_THREADGROUP
        ):
            raise AssertionError(
                f"{name}: threadgroup {tuple(threadgroup)} is not 1 to "
                f"{MAX_THREADS_PER_THREADGROUP} threads (Metal's limit)"
            )
        infos = [
            signature.InputInfo(n, a.dtype, a.ndim, a.size) for n, a in zip(input_names, inputs)
        ]
        gen = signature.generate(
            name,
            list(input_names),
            list(output_names),
            source,
            header,
            infos,
            list(output_dtypes),
            tuple(template),
        )
        kernel = self.build(gen)
        keep = []  # host buffers alive until the call returns
        pointers: dict[int, int] = {}
        guards = []  # (whole buffer, payload size, label), checked after the call

        def add(index: int, whole: np.ndarray, payload: np.ndarray):
            keep.append(whole)
            pointers[index] = payload.ctypes.data

        for p in gen.params:
            if p.kind in ("input", "scalar"):
                arr = to_numpy(inputs[input_names.index(p.name)])
                whole, payload = _guarded(max(arr.size, 1), arr.dtype, 0xFF)
                payload[: arr.size] = arr.reshape(-1)
                add(p.index, whole, payload)
                guards.append((whole, arr.size, f"input {p.name}"))
            elif p.kind == "shape":
                a = inputs[input_names.index(p.name)]
                shape = np.array(a.shape, dtype=np.int32)
                add(p.index, shape, shape)
            elif p.kind == "strides":
                a = inputs[input_names.index(p.name)]
                strides = np.ones(a.ndim, dtype=np.int64)
                for d in range(a.ndim - 2, -1, -1):
                    strides[d] = strides[d + 1] * a.shape[d + 1]
                add(p.index, strides, strides)
            elif p.kind == "ndim":
                a = inputs[input_names.index(p.name)]
                v = np.array([a.ndim], dtype=np.int32)
                add(p.index, v, v)
        outputs = []
        for i, p in enumerate(x for x in gen.params if x.kind == "output"):
            size = int(np.prod(output_shapes[i], dtype=np.int64))
            whole, payload = _guarded(size, _NUMPY[output_dtypes[i]], 0xFF)
            add(p.index, whole, payload)
            guards.append((whole, size, f"output {p.name}"))
            outputs.append((payload, output_shapes[i], output_dtypes[i]))

        argv = (ctypes.c_void_p * len(pointers))(*[pointers[i] for i in range(len(pointers))])
        g = (ctypes.c_uint * 3)(*[int(v) for v in grid])
        t = (ctypes.c_uint * 3)(*[max(1, min(int(a), int(b))) for a, b in zip(threadgroup, grid)])
        kernel.entry(argv, g, t)

        for whole, size, label in guards:
            raw = whole.view(np.uint8)
            item = whole.itemsize
            if (raw[: GUARD * item] != 0xFF).any() or (raw[(GUARD + size) * item :] != 0xFF).any():
                raise AssertionError(f"{gen.kernel_name}: {label} written out of bounds")
        return [
            from_numpy(payload.copy().reshape(shape), dtype) for payload, shape, dtype in outputs
        ]

    def run_launch(self, launch, source: str) -> list[mx.array]:
        """Execute a dflash2_mlx.kernels launch plan (the runtime's exact call) on the CPU."""
        spec = launch.spec
        return self.run(
            spec.name,
            list(spec.input_names),
            list(spec.output_names),
            source,
            list(launch.inputs),
            launch.output_shapes,
            launch.output_dtypes,
            launch.grid,
            launch.threadgroup,
            launch.template,
            spec.header,
        )


class HarnessLauncher:
    """A dflash2_mlx.kernels launcher that runs the kernels on the CPU harness: with it the
    dispatch (self-checks, fallbacks, the model paths) runs on any machine."""

    name = "cpu-harness"

    def __init__(self, cpu: CpuMetal):
        self.cpu = cpu

    def unavailable(self) -> str | None:
        return None

    def device(self) -> str:
        return f"CPU harness ({Path(self.cpu.compiler).name})"

    def __call__(self, launch, source: str) -> list[mx.array]:
        return self.cpu.run_launch(launch, source)
