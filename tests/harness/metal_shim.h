// CPU stand-ins for the Metal built-ins dflash2's kernel bodies use, so that the source MLX
// generates for `mx.fast.metal_kernel` (header + signature + body + template instantiation)
// compiles with a C++14 compiler (MSL is C++14-based) and runs one work item per call
// (tests/harness/runner.py; msl_lint.py rejects what C++ accepts and MSL does not).
//
// Modelled:
//   - address spaces `device`, `constant`, `thread` as empty macros (bodies must not name them:
//     a lint in tests/test_kernels.py keeps them out, since mismatches would only fail on a Mac);
//   - `[[kernel]]`, `[[buffer(i)]]`, `[[host_name(..)]]`, `[[thread_position_in_grid]]` ...:
//     unknown attributes, ignored by g++ (-Wno-attributes);
//   - scalar types uint, uint3 (x, y, z), int32_t, int64_t, ...; INFINITY and NAN (float);
//   - half / float16_t and bfloat / bfloat16_t as 16-bit storage types with EXPLICIT conversion
//     to and from float (round to nearest even, IEEE specials and subnormals). No arithmetic on
//     them: bodies convert to float, compute, and static_cast the result back;
//   - metal::{fma, abs, fabs, floor, ceil} on float (exact on both sides) and max/min on
//     integers;
//   - metal::precise::{exp, exp2, log, log2, sqrt, rsqrt, max, min, fmax, fmin} as the C++
//     library's (IEEE NaN handling: a NaN operand of max/min loses), and metal::fast::{...} the
//     way fast math evaluates them: exp(x) = exp2(x * log2(e)), log(x) = log2(x) * ln(2) in
//     float, NaN operands of max/min unspecified (modelled as the plain comparison).
//   The UNQUALIFIED float forms of those are deleted: on Metal they follow the library's math
//   mode (fast by default since macOS 15), so a body must say which one it means.
// Not modelled (a body using them does not compile here): threadgroup memory and barriers,
// SIMD-group/quad functions, atomics, vector types other than uint3, half/bfloat arithmetic.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#define device
#define constant
#define thread

typedef unsigned int uint;

struct uint3 {
  uint x, y, z;
};

namespace dflash2_harness {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// float -> bfloat16, round to nearest even; NaN stays a (quiet) NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float bf16_to_float(uint16_t b) { return bits_float(uint32_t(b) << 16); }

// float -> IEEE binary16, round to nearest even, with subnormals, overflow to inf, NaN.
inline uint16_t float_to_half(float f) {
  uint32_t u = float_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return uint16_t(sign | 0x7e00u);      // NaN
  if (u >= 0x47800000u) return uint16_t(sign | 0x7c00u);     // >= 2^16: inf
  if (u < 0x38800000u) {                                     // < 2^-14: subnormal or zero
    // Adding 0.5 (2^-1) aligns the value's bits so that float addition (round to nearest
    // even) rounds at the half-subnormal unit 2^-24; the low mantissa bits are the result.
    const float magic = bits_float(126u << 23);
    const float sum = bits_float(u) + magic;
    return uint16_t(sign | (float_bits(sum) - float_bits(magic)));
  }
  const uint32_t odd = (u >> 13) & 1u;
  u += 0xc8000fffu + odd;  // rebias exponent 127 -> 15 (mod 2^32) and round to nearest even
  return uint16_t(sign | (u >> 13));
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = std::ldexp(float(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace dflash2_harness

struct half {
  uint16_t bits;
  half() = default;
  explicit half(float f) : bits(dflash2_harness::float_to_half(f)) {}
  explicit operator float() const { return dflash2_harness::half_to_float(bits); }
};

struct bfloat {
  uint16_t bits;
  bfloat() = default;
  explicit bfloat(float f) : bits(dflash2_harness::float_to_bf16(f)) {}
  explicit operator float() const { return dflash2_harness::bf16_to_float(bits); }
};

typedef half float16_t;
typedef bfloat bfloat16_t;
static_assert(sizeof(half) == 2 && sizeof(bfloat) == 2, "16-bit storage");

namespace metal {
inline float abs(float x) { return std::fabs(x); }
inline float fabs(float x) { return std::fabs(x); }
inline float floor(float x) { return std::floor(x); }
inline float ceil(float x) { return std::ceil(x); }
inline float fma(float a, float b, float c) { return std::fma(a, b, c); }
inline int max(int a, int b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline uint max(uint a, uint b) { return a > b ? a : b; }
inline uint min(uint a, uint b) { return a < b ? a : b; }

// Math-mode dependent on Metal: name metal::precise:: or metal::fast:: instead.
float exp(float) = delete;
float exp2(float) = delete;
float log(float) = delete;
float log2(float) = delete;
float sqrt(float) = delete;
float rsqrt(float) = delete;
float max(float, float) = delete;
float min(float, float) = delete;
float fmax(float, float) = delete;
float fmin(float, float) = delete;

namespace precise {
inline float exp(float x) { return std::exp(x); }
inline float exp2(float x) { return std::exp2(x); }
inline float log(float x) { return std::log(x); }
inline float log2(float x) { return std::log2(x); }
inline float sqrt(float x) { return std::sqrt(x); }
inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float fmax(float a, float b) { return std::fmax(a, b); }
inline float fmin(float a, float b) { return std::fmin(a, b); }
}  // namespace precise

namespace fast {
inline float exp2(float x) { return std::exp2(x); }
inline float exp(float x) { return std::exp2(x * 1.44269504f); }
inline float log2(float x) { return std::log2(x); }
inline float log(float x) { return std::log2(x) * 0.693147181f; }
inline float sqrt(float x) { return std::sqrt(x); }
inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }
inline float max(float a, float b) { return a > b ? a : b; }
inline float min(float a, float b) { return a < b ? a : b; }
inline float fmax(float a, float b) { return a > b ? a : b; }
inline float fmin(float a, float b) { return a < b ? a : b; }
}  // namespace fast
}  // namespace metal
