"""What C++ accepts and the Metal Shading Language does not, checked in kernel bodies before the
harness compiles them (a body that passes here and in g++ -std=c++14 should also compile on a
Mac; the harness cannot run Apple's compiler).

MSL is C++14 without the standard library, `double`, lambdas, `new` / `delete`, exceptions,
RTTI or `static` locals; every pointer and reference names an address space; Metal keywords
and type names (`half`, `kernel`, `float2`, ...) cannot name variables. In C++ a floating
literal without a suffix is a `double` (MSL computes it in float), and the C library's math
functions resolve where MSL's `using namespace metal` would pick a math-mode dependent one, so
both are rejected too: bodies write `0.5f` and call `metal::precise::exp`.
"""

from __future__ import annotations

import re

ADDRESS_SPACES = (
    "device",
    "constant",
    "thread",
    "threadgroup",
    "threadgroup_imageblock",
    "ray_data",
    "object_data",
)
# Metal keywords a C++ compiler reads as plain identifiers.
MSL_KEYWORDS = ADDRESS_SPACES + ("kernel", "vertex", "fragment")
_SCALARS = (
    "bool",
    "char",
    "uchar",
    "short",
    "ushort",
    "int",
    "uint",
    "long",
    "ulong",
    "half",
    "bfloat",
    "float",
)
# MSL type names (a variable of that name compiles in C++, not in MSL).
MSL_TYPES = frozenset(
    (
        "half",
        "bfloat",
        "uchar",
        "ushort",
        "ulong",
        "sampler",
        "atomic_int",
        "atomic_uint",
        "atomic_bool",
        "atomic_float",
        "float16_t",
        "bfloat16_t",
    )
    + tuple(f"{s}{n}" for s in _SCALARS for n in (2, 3, 4))
    + tuple(f"packed_{s}{n}" for s in _SCALARS for n in (2, 3, 4))
    + tuple(f"{s}{c}x{r}" for s in ("half", "float") for c in (2, 3, 4) for r in (2, 3, 4))
    + tuple(
        f"texture{d}"
        for d in ("1d", "1d_array", "2d", "2d_array", "2d_ms", "3d", "cube", "cube_array", "buffer")
    )
)
# Types a pointer or reference could be formed from in a body.
POINTEE_TYPES = frozenset(
    _SCALARS
    + (
        "void",
        "auto",
        "size_t",
        "ptrdiff_t",
        "float16_t",
        "bfloat16_t",
        "uint3",
        "int8_t",
        "int16_t",
        "int32_t",
        "int64_t",
        "uint8_t",
        "uint16_t",
        "uint32_t",
        "uint64_t",
    )
)
# Math whose C library versions would compile here: a body names metal:: (precise / fast).
MATH_FUNCTIONS = (
    "exp",
    "exp2",
    "exp10",
    "log",
    "log2",
    "log10",
    "pow",
    "powr",
    "sqrt",
    "rsqrt",
    "sin",
    "cos",
    "tan",
    "sinh",
    "cosh",
    "tanh",
    "asin",
    "acos",
    "atan",
    "atan2",
    "erf",
    "fabs",
    "abs",
    "fma",
    "fmax",
    "fmin",
    "max",
    "min",
    "clamp",
    "floor",
    "ceil",
    "round",
    "trunc",
    "isnan",
    "isinf",
    "isfinite",
    "memcpy",
    "memset",
    "printf",
    "malloc",
    "free",
)

_WORD_RULES = (
    (r"\bstd\s*::", "`std::` (MSL has no C++ standard library)"),
    (r"\bdouble\b", "`double` (MSL has no double precision)"),
    (r"\bnew\b", "`new` (no dynamic allocation in MSL)"),
    (r"\bdelete\b", "`delete` (no dynamic allocation in MSL)"),
    (r"\bstatic\b", "`static` local variable (not allowed in MSL functions)"),
    (r"\b(?:throw|try|catch)\b", "exceptions (not in MSL)"),
    (r"\b(?:typeid|dynamic_cast|virtual)\b", "RTTI / virtual functions (not in MSL)"),
    (r"\bgoto\b", "`goto` (not in MSL)"),
    # A `[...]` that does not follow an identifier, `]` or `)` opens a lambda, not an index.
    (
        r"(?:^|[=,(;{}?:!&|+\-*/<>]|\breturn)\s*\[[^\[\]]*\]\s*(?:\(|\{|mutable\b)",
        "lambda (not in MSL)",
    ),
    (
        r"(?<![\w.])(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?(?![\w.])|(?<![\w.])\d+[eE][+-]?\d+(?![\w.])",
        "floating literal without an `f` suffix (a double in C++, a float in MSL)",
    ),
)


def strip_comments(source: str) -> str:
    """Comments blanked (line structure kept, so messages can give line numbers)."""
    source = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group()), source, flags=re.S)
    return re.sub(r"//[^\n]*", "", source)


def _line(code: str, pos: int) -> int:
    return code.count("\n", 0, pos) + 1


def _pointer_problems(code: str, template_names) -> list[tuple[int, str]]:
    out = []
    types = "|".join(sorted(POINTEE_TYPES | set(template_names), key=len, reverse=True))
    for m in re.finditer(rf"\b({types})\s*(?:const\s*)?(\*|&(?!&))", code):
        start = max(code.rfind(c, 0, m.start()) for c in ";{}(,<")
        if re.search(rf"\b(?:{'|'.join(ADDRESS_SPACES)})\b", code[start + 1 : m.start()]):
            continue
        kind = "pointer" if m.group(2) == "*" else "reference"
        out.append(
            (
                m.start(),
                f"{kind} to `{m.group(1)}` without an address space "
                "(MSL needs device / constant / thread / threadgroup)",
            )
        )
    return out


def _declared_name_problems(code: str, template_names) -> list[tuple[int, str]]:
    reserved = MSL_TYPES | set(MSL_KEYWORDS)
    out = []
    decl = re.compile(
        r"(?:^|[;{}(])\s*(?:const\s+)?[A-Za-z_]\w*(?:\s*<[^;{}<>]*>)?\s+"
        r"([A-Za-z_]\w*)\s*(?=[=;,\[)])",
        re.M,
    )
    for m in decl.finditer(code):
        name = m.group(1)
        if name in reserved or name in template_names:
            out.append(
                (
                    m.start(1),
                    f"`{name}` names a variable (an MSL type or keyword, or a template parameter)",
                )
            )
    return out


def lint(source: str, template_names=()) -> list[str]:
    """Problems with a kernel body (or header) as MSL, as 'line N: what' strings; [] if none."""
    code = strip_comments(source)
    found: list[tuple[int, str]] = []
    for pattern, what in _WORD_RULES:
        found += [(m.start(), what) for m in re.finditer(pattern, code, flags=re.M)]
    for m in re.finditer(rf"\b({'|'.join(MSL_KEYWORDS)})\b", code):
        found.append(
            (
                m.start(),
                f"`{m.group(1)}` (a Metal keyword: the generated signature "
                "owns address spaces and qualifiers)",
            )
        )
    for m in re.finditer(rf"(?<![\w:.])\b({'|'.join(MATH_FUNCTIONS)})\s*\(", code):
        found.append(
            (
                m.start(1),
                f"`{m.group(1)}(` without `metal::` (C's version here, a "
                "math-mode dependent one on Metal)",
            )
        )
    found += _pointer_problems(code, template_names)
    found += _declared_name_problems(code, set(template_names))
    return [f"line {_line(code, pos)}: {what}" for pos, what in sorted(set(found))]
