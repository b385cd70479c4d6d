"""What `mx.fast.metal_kernel` generates around a body, ported from MLX (mlx/fast.cpp,
`metal_kernel`, `write_signature`, `write_template`; MLX 0.2x-0.32): the kernel name, the
template header, the signature (inputs with optional _shape/_strides/_ndim, outputs, Metal
attributes detected by substring in the body) and the explicit template instantiation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import mlx.core as mx

MAX_CONSTANT_ARRAY_SIZE = 8  # inputs with fewer elements go to the constant address space

TYPE_STRINGS = {
    mx.float32: "float",
    mx.float16: "float16_t",
    mx.bfloat16: "bfloat16_t",
    mx.bool_: "bool",
    mx.int8: "int8_t",
    mx.int16: "int16_t",
    mx.int32: "int32_t",
    mx.int64: "int64_t",
    mx.uint8: "uint8_t",
    mx.uint16: "uint16_t",
    mx.uint32: "uint32_t",
    mx.uint64: "uint64_t",
}

# (attribute, type), in MLX's order.
METAL_ATTRIBUTES = (
    ("dispatch_quadgroups_per_threadgroup", "uint"),
    ("dispatch_simdgroups_per_threadgroup", "uint"),
    ("dispatch_threads_per_threadgroup", "uint3"),
    ("grid_origin", "uint3"),
    ("grid_size", "uint3"),
    ("quadgroup_index_in_threadgroup", "uint"),
    ("quadgroups_per_threadgroup", "uint"),
    ("simdgroup_index_in_threadgroup", "uint"),
    ("simdgroups_per_threadgroup", "uint"),
    ("thread_execution_width", "uint"),
    ("thread_index_in_quadgroup", "uint"),
    ("thread_index_in_simdgroup", "uint"),
    ("thread_index_in_threadgroup", "uint"),
    ("thread_position_in_grid", "uint3"),
    ("thread_position_in_threadgroup", "uint3"),
    ("threadgroup_position_in_grid", "uint3"),
    ("threadgroups_per_grid", "uint3"),
    ("threads_per_grid", "uint3"),
    ("threads_per_simdgroup", "uint"),
    ("threads_per_threadgroup", "uint3"),
)


def type_string(dtype: mx.Dtype) -> str:
    try:
        return TYPE_STRINGS[dtype]
    except KeyError:
        raise ValueError(f"Unsupported compilation type {dtype}") from None


@dataclass(frozen=True)
class InputInfo:
    name: str
    dtype: mx.Dtype
    ndim: int
    size: int


@dataclass(frozen=True)
class Param:
    """One parameter of the generated signature, in order."""

    kind: str  # "input" | "scalar" | "shape" | "strides" | "ndim" | "output" | "attribute"
    name: str
    ctype: str  # element type (arrays), or the attribute's type
    index: int  # position among the arrays passed (inputs then outputs); -1 for attributes


@dataclass(frozen=True)
class Generated:
    kernel_name: str
    source: str
    params: tuple[Param, ...]
    template_def: str  # "<float, 16>" or ""


def shape_infos(source: str, input_names) -> list[tuple[bool, bool, bool]]:
    return [
        (f"{n}_shape" in source, f"{n}_strides" in source, f"{n}_ndim" in source)
        for n in input_names
    ]


def attributes(source: str) -> list[tuple[str, str]]:
    return [(a, t) for a, t in METAL_ATTRIBUTES if a in source]


def _template_value(arg) -> str:
    if isinstance(arg, bool):
        return "1" if arg else "0"
    if isinstance(arg, int):
        return str(arg)
    return type_string(arg)


def write_template(template) -> str:
    return "<" + ", ".join(_template_value(a) for _, a in template) + ">"


def _template_param_type(arg) -> str:
    if isinstance(arg, bool):
        return "bool"
    if isinstance(arg, int):
        return "int"
    return "typename"


def generate(
    name: str,
    input_names,
    output_names,
    source: str,
    header: str,
    inputs: list[InputInfo],
    output_dtypes,
    template=(),
    atomic_outputs: bool = False,
) -> Generated:
    """The kernel name and full source MLX builds for one call (before MLX prepends its utils)."""
    if len(inputs) != len(input_names):
        raise ValueError("inputs and input_names differ in length")
    if not output_names:
        raise ValueError("[metal_kernel] Must specify at least one output.")
    infos = shape_infos(source, input_names)
    attrs = attributes(source)

    kernel_name = "custom_kernel_" + name
    template_def = ""
    if template:
        template_def = write_template(template)
        template_hash = re.sub(r"<|>|(, )", "_", template_def)[:-1]
        kernel_name += "_" + template_hash
    for info in inputs:
        kernel_name += "_" + type_string(info.dtype)
        if info.ndim == 0:
            kernel_name += "s"
        elif info.size < MAX_CONSTANT_ARRAY_SIZE:
            kernel_name += "c"
    for dtype in output_dtypes:
        kernel_name += "_" + type_string(dtype)

    out = [header]
    if template:
        out.append(
            "template <" + ", ".join(f"{_template_param_type(a)} {n}" for n, a in template) + ">\n"
        )
    out.append(f"[[kernel]] void {kernel_name}(\n")
    params: list[Param] = []
    index = 0
    for i, info in enumerate(inputs):
        nm = input_names[i]
        ctype = type_string(info.dtype)
        location = "constant" if info.size < MAX_CONSTANT_ARRAY_SIZE else "device"
        ref = "&" if info.ndim == 0 else "*"
        out.append(f"  const {location} {ctype}{ref} {nm} [[buffer({index})]],\n")
        params.append(Param("scalar" if info.ndim == 0 else "input", nm, ctype, index))
        index += 1
        if info.ndim > 0:
            has_shape, has_strides, has_ndim = infos[i]
            if has_shape:
                out.append(f"  const constant int* {nm}_shape [[buffer({index})]],\n")
                params.append(Param("shape", nm, "int", index))
                index += 1
            if has_strides:
                out.append(f"  const constant int64_t* {nm}_strides [[buffer({index})]],\n")
                params.append(Param("strides", nm, "int64_t", index))
                index += 1
            if has_ndim:
                out.append(f"  const constant int& {nm}_ndim [[buffer({index})]],\n")
                params.append(Param("ndim", nm, "int", index))
                index += 1
    for i, nm in enumerate(output_names):
        ctype = type_string(output_dtypes[i])
        elem = f"atomic<{ctype}>" if atomic_outputs else ctype
        line = f"  device {elem}* {nm} [[buffer({index})]]"
        # MLX's condition, kept verbatim (it compares a buffer index with a parameter count).
        if index < len(inputs) + len(output_names) - 1 or attrs:
            line += ",\n"
        else:
            line += ") {\n"
        out.append(line)
        params.append(Param("output", nm, ctype, index))
        index += 1
    for j, (attr, atype) in enumerate(attrs):
        out.append(f"  {atype} {attr} [[{attr}]]")
        out.append(",\n" if j < len(attrs) - 1 else ") {\n")
        params.append(Param("attribute", attr, atype, -1))
    out.append(source)
    out.append("\n}\n")
    if template:
        full = kernel_name + template_def
        out.append(
            f'\ntemplate [[host_name("{kernel_name}")]] [[kernel]] decltype({full}) {full};\n'
        )
    return Generated(kernel_name, "".join(out), tuple(params), template_def)
