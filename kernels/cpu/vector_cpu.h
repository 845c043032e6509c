// The vector type of radixlm's C++ CPU kernels, sized for the instruction set
// they are built for, and the helpers every kernel shares.
//
// radixlm.kernels.native builds each kernel for one target: -march=native,
// x86-64-v3 (AVX2 + FMA) or x86-64-v4 (AVX-512). The target decides the
// register file the kernels' tiles must fit:
//
//   AVX-512: 32 registers of 512 bits -> vf holds 16 floats (kLanes = 16)
//   AVX2:    16 registers of 256 bits -> vf holds  8 floats (kLanes = 8)
//
// and kRegisters says how many there are, so a kernel sizes its register tiles
// (accumulators + operands) to fit them. A 512-bit vector type on AVX2 would be
// lowered to pairs of 256-bit registers: tiles sized for AVX-512's 32 registers
// then spill on every step (measured: prefill attention 4.5x slower than torch
// on an AVX2-only CPU before this file existed).
//
// GCC vector extensions, not intrinsics: the same code is lowered for either
// width. Arithmetic is float32; storage is float32 or bfloat16 (uint16_t, the
// high half of a float32's bits).

#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VL__)
#define RADIXLM_VECTOR_BYTES 64
#elif defined(__AVX2__) && defined(__FMA__)
#define RADIXLM_VECTOR_BYTES 32
#else
#error "radixlm's CPU kernels need AVX2 with FMA, or AVX-512 (build for x86-64-v3 or newer)"
#endif

// Whether products of bfloat16 values take AVX512-BF16 dot products (vdpbf16ps: 32
// products a 512-bit instruction, two a lane, each exact in float32): where the build
// has them (-march=native on such a CPU).
#if defined(__AVX512BF16__) && RADIXLM_VECTOR_BYTES == 64
#define RADIXLM_BF16_DOT 1
#else
#define RADIXLM_BF16_DOT 0
#endif

namespace {

constexpr int kVectorBytes = RADIXLM_VECTOR_BYTES;
constexpr int kLanes = kVectorBytes / 4;            // floats per vector
constexpr int kRegisters = kLanes == 16 ? 32 : 16;  // vector registers of the ISA

// A vector of L floats (8: a ymm register, 16: a zmm) for code that picks its
// width per shape rather than per ISA; loads widen bfloat16 (the high half of a
// float32's bits) to float32.
template <int L>
struct Floats;

#define RADIXLM_FLOATS(L)                                                   \
  template <>                                                               \
  struct Floats<L> {                                                        \
    typedef float type __attribute__((vector_size(4 * L)));                 \
    typedef uint32_t bits __attribute__((vector_size(4 * L)));              \
    typedef uint16_t half __attribute__((vector_size(2 * L)));              \
    static type load(const float* p) {                                      \
      type r;                                                               \
      std::memcpy(&r, p, sizeof r);                                         \
      return r;                                                             \
    }                                                                       \
    static type load(const uint16_t* p) {                                   \
      half h;                                                               \
      std::memcpy(&h, p, sizeof h);                                         \
      bits u = __builtin_convertvector(h, bits) << 16;                      \
      type r;                                                               \
      std::memcpy(&r, &u, sizeof r);                                        \
      return r;                                                             \
    }                                                                       \
    static void store(float* p, type x) { std::memcpy(p, &x, sizeof x); }  \
  };

RADIXLM_FLOATS(8)
#if RADIXLM_VECTOR_BYTES == 64
RADIXLM_FLOATS(16)
#endif
#undef RADIXLM_FLOATS

// The ISA's own width, which most of the kernels use.
using vf = Floats<kLanes>::type;
using vu = Floats<kLanes>::bits;
using vh = Floats<kLanes>::half;
typedef int32_t vi __attribute__((vector_size(kVectorBytes)));

inline vf splat(float x) { return vf{} + x; }

inline vf load(const float* p) { return Floats<kLanes>::load(p); }

inline vf load(const uint16_t* p) { return Floats<kLanes>::load(p); }  // bfloat16 widened

inline void store(float* p, vf x) { Floats<kLanes>::store(p, x); }

inline void store(uint16_t* p, vf x) {  // float32 -> bfloat16, round to nearest even
  vu u;
  std::memcpy(&u, &x, sizeof u);
  vu is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  vu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  vu quiet = (u >> 16) | 0x40u;
  vh h = __builtin_convertvector(is_nan ? quiet : rounded, vh);
  std::memcpy(p, &h, sizeof h);
}

// KV cache codes (a quantized pool, radixlm.runtime.mem_cache.kv_quant): one byte
// per value and a bfloat16 scale (uint16_t) per token and KV head beside them; a
// value is code * scale in float32. The fp8 formats are tag types over their bits (C++17 has no fp8).
struct Fp8E4M3 {
  uint8_t bits;
};
struct Fp8E5M2 {
  uint8_t bits;
};

template <typename C>
constexpr bool kIsCode =
    std::is_same_v<C, int8_t> || std::is_same_v<C, Fp8E4M3> || std::is_same_v<C, Fp8E5M2>;

// What load(codes) returns times code_unit<C>() is the codes' value: a power of two
// a kernel folds into the scale (once per token and head, exact), so that the
// widening itself is two or three instructions a vector.
template <typename C>
constexpr float code_unit() {
  return std::is_same_v<C, Fp8E4M3> ? 256.0f : 1.0f;
}

// The widening is written with intrinsics: GCC lowers __builtin_convertvector from
// a byte vector lane by lane (measured: int8 decode attention 2.4x slower than
// bfloat16 before, one movsbl per value).
#if RADIXLM_VECTOR_BYTES == 64
inline __m128i load_bytes(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
#else
inline __m128i load_bytes(const void* p) { return _mm_loadl_epi64(static_cast<const __m128i*>(p)); }
#endif

// int8 codes: sign-extended to int32, converted (vpmovsxbd + vcvtdq2ps), exact.
inline vf load(const int8_t* p) {
#if RADIXLM_VECTOR_BYTES == 64
  return (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load_bytes(p)));
#else
  return (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load_bytes(p)));
#endif
}

// e5m2 is the high byte of an IEEE half (same exponent bias, 2 of its 10 mantissa
// bits): shifted up 8 bits it is that half, exactly, subnormals included; F16C
// (both targets have it) widens halves to float32.
inline vf load(const Fp8E5M2* p) {
#if RADIXLM_VECTOR_BYTES == 64
  return (vf)_mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(load_bytes(p)), 8));
#else
  return (vf)_mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(load_bytes(p)), 8));
#endif
}

// e4m3 (bias 7) placed in a half's bits (bias 15): the byte sign-extended to 16
// bits and shifted up 7 has the sign at bit 15, a copy of it at bit 14 (cleared:
// the half's top exponent bit) and exponent and mantissa at bits 7..13: the value
// times 2^-8, subnormals included (a half's subnormals have the same shape);
// code_unit<Fp8E4M3>() = 256 undoes the factor. Three integer instructions and
// the conversion per vector: decode attention over e4m3 codes 3-5x faster than
// with a 256-entry float table and a gather per vector (benchmarks/README.md).
inline vf load(const Fp8E4M3* p) {
  const short kKeep = short(0xBF80);  // sign, then exponent and mantissa bits 13..7
#if RADIXLM_VECTOR_BYTES == 64
  const __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(load_bytes(p)), 7);
  return (vf)_mm512_cvtph_ps(_mm256_and_si256(h, _mm256_set1_epi16(kKeep)));
#else
  const __m128i h = _mm_slli_epi16(_mm_cvtepi8_epi16(load_bytes(p)), 7);
  return (vf)_mm256_cvtph_ps(_mm_and_si128(h, _mm_set1_epi16(kKeep)));
#endif
}

// One value as float32: float as is, bfloat16 widened.
inline float to_float(float x) { return x; }

inline float to_float(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// One float32 value to bfloat16, rounded to nearest even as store(uint16_t*, vf)
// and torch's .to(torch.bfloat16) round it (a NaN stays a NaN, quieted).
inline uint16_t to_bfloat16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// How far ahead of a weight row's stream the kernels that read weight rows one
// after another prefetch, in bytes (into L2).
constexpr int64_t kRowPrefetch = 4096;

// How far ahead a tile of R weight rows prefetches, in weights (`least` at least):
// its rows are adjacent, so with several each row's stream fetches the line at the
// same k of a tile to come. A fixed distance shorter than the tile would land in the
// tile's own later rows and leave the next tile's unfetched but for its first rows
// (a 4-row bfloat16 tile of 2,048-wide rows, 8 KB ahead: half of them). One row is
// one stream: `least` itself.
template <int R>
int64_t tile_ahead(int64_t K, int64_t least) {
  if constexpr (R == 1) return least;
  return (least + R * K - 1) / (R * K) * (R * K);
}

typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

// The eight-lane half-sum and half-max of a vector (the vector itself on AVX2).
inline v8 fold_sum(vf x) {
#if RADIXLM_VECTOR_BYTES == 64
  return __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7) +
         __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
#else
  return x;
#endif
}

inline v8 fold_max(vf x) {
#if RADIXLM_VECTOR_BYTES == 64
  const v8 lo = __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7);
  const v8 hi = __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
  return lo > hi ? lo : hi;
#else
  return x;
#endif
}

// The sum of the lanes, by halving.
inline float hsum(vf x) {
  const v8 a = fold_sum(x);
  const v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// The sums of four vectors' lanes, {sum a, sum b, sum c, sum d}: their halvings
// interleaved, six shuffles and four adds past the eight-lane folds, where four
// hsum calls are four dependent chains ending in scalar adds.
inline v4 hsum4(vf a, vf b, vf c, vf d) {
  const v8 a8 = fold_sum(a), b8 = fold_sum(b), c8 = fold_sum(c), d8 = fold_sum(d);
  // [a0+a2, a1+a3, b0+b2, b1+b3, a4+a6, a5+a7, b4+b6, b5+b7], and the same of c, d
  const v8 ab = __builtin_shufflevector(a8, b8, 0, 1, 8, 9, 4, 5, 12, 13) +
                __builtin_shufflevector(a8, b8, 2, 3, 10, 11, 6, 7, 14, 15);
  const v8 cd = __builtin_shufflevector(c8, d8, 0, 1, 8, 9, 4, 5, 12, 13) +
                __builtin_shufflevector(c8, d8, 2, 3, 10, 11, 6, 7, 14, 15);
  // [a0..3, b0..3, c0..3, d0..3, a4..7, b4..7, c4..7, d4..7] (sums of those lanes)
  const v8 abcd = __builtin_shufflevector(ab, cd, 0, 2, 8, 10, 4, 6, 12, 14) +
                  __builtin_shufflevector(ab, cd, 1, 3, 9, 11, 5, 7, 13, 15);
  return __builtin_shufflevector(abcd, abcd, 0, 1, 2, 3) +
         __builtin_shufflevector(abcd, abcd, 4, 5, 6, 7);
}

// The largest lane, by halving.
inline float hmax(vf x) {
  const v8 a = fold_max(x);
  const v4 a_lo = __builtin_shufflevector(a, a, 0, 1, 2, 3);
  const v4 a_hi = __builtin_shufflevector(a, a, 4, 5, 6, 7);
  const v4 b = a_lo > a_hi ? a_lo : a_hi;
  return std::max(std::max(b[0], b[1]), std::max(b[2], b[3]));
}

// 0, 1, ..., kLanes - 1.
inline vi lane_index() {
  vi lane;
  for (int i = 0; i < kLanes; ++i) lane[i] = i;
  return lane;
}

// Lanes [0, n) of x, the rest replaced by fill (a row's last, partial vector:
// score buffers hold whole vectors).
inline vf first_lanes(vf x, int64_t n, float fill) {
  return lane_index() < vi{} + int32_t(n) ? x : splat(fill);
}

// exp(x) for x <= 0 (scores minus their max): Cody-Waite reduction by ln 2 and a
// degree-6 polynomial (the Cephes expf coefficients), about 1 ulp; below -87
// the result is a denormal or 0, as for std::exp.
inline vf exp_nonpositive(vf x) {
  x = x < -87.0f ? splat(-87.0f) : x;
  vi n = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, vi);  // round(x / ln 2)
  vf nf = __builtin_convertvector(n, vf);
  vf r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
  vf p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  vi bits = (n + 127) << 23;
  vf two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

// max(x[0 .. n)) for n >= 1, a vector at a time (a scalar running max is one
// dependent max per element: most of extend attention's time before it was
// vectorised).
inline float max_of(const float* x, int64_t n) {
  vf top = splat(-INFINITY);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const vf v = load(x + j);
    top = v > top ? v : top;
  }
  if (j < n) {
    const vf v = first_lanes(load(x + j), n - j, -INFINITY);
    top = v > top ? v : top;
  }
  return hmax(top);
}

// Softmax numerators in place: x[j] = exp(x[j] - top) for j < n and 0 for
// n <= j < round_up(n, kLanes) (x must hold that many); returns their sum.
// Every x[j] - top <= 0 for j < n. Only the last, partial vector is masked.
inline float exp_in_place(float* x, int64_t n, float top) {
  vf acc = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const vf e = exp_nonpositive(load(x + j) - top);
    store(x + j, e);
    acc += e;
  }
  if (j < n) {
    const vf d = load(x + j) - top;  // lanes past n: later keys' scores, any sign
    const vf e = first_lanes(exp_nonpositive(d < 0.0f ? d : splat(0.0f)), n - j, 0.0f);
    store(x + j, e);
    acc += e;
  }
  return hsum(acc);
}

// tanh(x): x + x^3 P(x^2) for |x| < 0.625 (the Cephes tanhf polynomial), else
// sign(x) (1 - e) / (1 + e) with e = exp(-2|x|) <= 0.29 (no cancellation); a few
// ulp either way, and +-1 once exp_nonpositive's clamp makes e negligible.
inline vf tanh_of(vf x) {
  const vf ax = x < 0.0f ? -x : x;
  const vf z = x * x;
  vf p = splat(-5.70498872745e-3f);
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const vf small = x + x * z * p;
  const vf e = exp_nonpositive(-2.0f * ax);
  const vf large = (1.0f - e) / (1.0f + e);
  return ax < 0.625f ? small : (x < 0.0f ? -large : large);
}

// Attention soft-capping in place: x[j] = cap tanh(x[j] / cap) for j < round_up(n,
// kLanes) (x must hold that many; lanes past n are computed and ignored).
inline void softcap_in_place(float* x, int64_t n, float cap) {
  const float inverse = 1.0f / cap;
  for (int64_t j = 0; j < n; j += kLanes) store(x + j, tanh_of(load(x + j) * inverse) * cap);
}

// out[i] = exp(x[i]) for i < n, every x[i] <= 0; x and out hold round_up(n,
// kLanes) floats (the lanes past n are computed and ignored).
inline void exp_array(const float* x, float* out, int n) {
  for (int i = 0; i < n; i += kLanes) store(out + i, exp_nonpositive(load(x + i)));
}

}  // namespace

// Which build this is: the vector width in floats (16 for AVX-512, 8 for AVX2),
// so the loader can check that it got the build it asked for.
extern "C" int radixlm_vector_lanes() { return kLanes; }
