// Products and dequantization for int8 weights in groups: codes (N, K) int8, and a
// float32 scale and zero point per group of ``group`` inputs of a row:
//
//   w[n][k] = q[n][k] * scale[n][k / group] + zero[n][k / group]
//
// the exact home of llama.cpp's 5-, 6- and 8-bit blocks (Q5_0, Q5_1, Q5_K, Q6_K,
// Q8_0; radixlm.runtime.model_store.gguf_weights), which torch has no kernel for.
//
// The product of a few rows reads the codes once (memory-bound, as decode is):
//
//   y[m][n] = sum_g ( scale[n][g] * sum_{k in g} q[n][k] x[m][k] + zero[n][g] * xsum[m][g] )
//
// with xsum[m][g] the sum of row m's inputs over group g, computed once per call.
// Where the build has AVX512-VNNI the products run on int8 dot products of the
// inputs quantized per 32 (int8_dot_cpu.h, llama.cpp's way); elsewhere each group's
// codes are widened to float32 and scaled once per tile of rows. Arithmetic is
// float32 and the inputs are float32 or bfloat16 (widened on entry).

#include <vector>

#include <immintrin.h>

#include "int8_dot_cpu.h"
#include "vector_cpu.h"

namespace {

// kLanes int8 codes as floats. An intrinsic: GCC lowers the vector extension's
// int8 -> int32 conversion lane by lane (measured 10x slower than the product needs).
inline vf widen(const int8_t* q) {
#if RADIXLM_VECTOR_BYTES == 64
  const __m512i wide = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
#else
  const __m256i wide = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
#endif
  vi lanes;
  std::memcpy(&lanes, &wide, sizeof lanes);
  return __builtin_convertvector(lanes, vf);
}

inline void put(float* y, float v) { *y = v; }

inline void put(uint16_t* y, float v) {  // as store(): round to nearest even, NaN kept quiet
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  *y = static_cast<uint16_t>(nan ? (u >> 16) | 0x40u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// The inputs as float32, and the sums of each row's inputs over each group,
// group-major ((groups, rows)) so a tile's rows are adjacent; no sums when every zero
// point is 0 (Q8_0, Q5_0, Q6_K).
struct Inputs {
  std::vector<float> x;     // (m, k)
  std::vector<float> sums;  // (groups, m)
  int64_t m, k;
};

template <typename T>
Inputs widen_inputs(const T* x, int64_t m, int64_t k, int64_t group, bool offsets) {
  Inputs in{std::vector<float>(m * k), {}, m, k};
  for (int64_t i = 0; i < m * k; ++i) in.x[i] = to_float(x[i]);
  if (offsets) {
    in.sums.assign((k / group) * m, 0.0f);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t kk = 0; kk < k; ++kk) in.sums[(kk / group) * m + r] += in.x[r * k + kk];
  }
  return in;
}

// y[m0 + r][n0 + c] for r < R, c < C: a register tile of R * C accumulators, so
// each input vector loaded serves C weight rows and each widened weight vector R
// input rows (one weight row at a time streamed the whole input from L2 per row:
// the product of 32 rows ran at L2's bandwidth, 8x below the FMA units).
template <int R, int C, typename T>
void tile(const Inputs& in, const int8_t* q, const float* s, const float* z, int64_t group,
          int64_t m0, int64_t n0, T* y, int64_t n_total) {
  const int64_t k = in.k, groups = k / group;
  const float* x = in.x.data() + m0 * k;
  q += n0 * k, s += n0 * groups, z += n0 * groups;
  vf acc[R][C] = {};
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t kk = g * group; kk < (g + 1) * group; kk += kLanes) {
      vf w[C];
      for (int c = 0; c < C; ++c) w[c] = widen(q + c * k + kk) * s[c * groups + g];
      for (int r = 0; r < R; ++r) {
        const vf xv = load(x + r * k + kk);
        for (int c = 0; c < C; ++c) acc[r][c] += w[c] * xv;
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float offset = 0.0f;
      if (!in.sums.empty())
        for (int64_t g = 0; g < groups; ++g) offset += z[c * groups + g] * in.sums[g * in.m + m0 + r];
      put(y + (m0 + r) * n_total + n0 + c, hsum(acc[r][c]) + offset);
    }
}

// Tiles of kRows inputs and kCols weight rows: 16 accumulators of AVX-512's 32
// registers, 8 of AVX2's 16.
constexpr int kRows = 4;
constexpr int kCols = kRegisters == 32 ? 4 : 2;

template <int C, typename T>
void weight_rows(const Inputs& in, const int8_t* q, const float* s, const float* z,
                 int64_t group, int64_t n0, T* y, int64_t n) {
  int64_t m0 = 0;
  for (; m0 + kRows <= in.m; m0 += kRows) tile<kRows, C>(in, q, s, z, group, m0, n0, y, n);
  for (; m0 < in.m; ++m0) tile<1, C>(in, q, s, z, group, m0, n0, y, n);
}

#if RADIXLM_INT8_DOT
// The product on dot products: columns in tiles of kDotCols, rows of kDotRows.
template <int C, typename T>
void dot_columns(const Inputs& in, const DotInputs& dots, const int8_t* q, const float* s,
                 const float* z, int64_t group, __m512i idx, int64_t n0, T* y, int64_t n) {
  const int64_t groups = in.k / group;
  auto finish = [&](int64_t row, int64_t col, float dot) {  // sums: of the inputs as read
    float offset = 0.0f;
    if (!in.sums.empty())
      for (int64_t g = 0; g < groups; ++g) offset += z[col * groups + g] * in.sums[g * in.m + row];
    put(y + row * n + col, dot + offset);
  };
  int64_t m0 = 0;
  for (; m0 + kDotRows <= in.m; m0 += kDotRows) {
    float out[kDotRows][C];
    dot_tile<kDotRows, C>(dots, q, s, group, idx, m0, n0, out);
    for (int r = 0; r < kDotRows; ++r)
      for (int c = 0; c < C; ++c) finish(m0 + r, n0 + c, out[r][c]);
  }
  for (; m0 < in.m; ++m0) {
    float out[1][C];
    dot_tile<1, C>(dots, q, s, group, idx, m0, n0, out);
    for (int c = 0; c < C; ++c) finish(m0, n0 + c, out[0][c]);
  }
}
#endif

template <typename T>
int gemm(const T* x, const int8_t* q, const float* scale, const float* zero, T* y, int64_t m,
         int64_t n, int64_t k, int64_t group) {
  if (group <= 0 || group % kLanes || k % group) return 1;
  bool offsets = false;
  for (int64_t i = 0; zero != nullptr && i < n * (k / group) && !offsets; ++i)
    offsets = zero[i] != 0.0f;
  Inputs in = widen_inputs(x, m, k, group, offsets);
#if RADIXLM_INT8_DOT
  if (dot_takes(k, group)) {
    DotInputs dots;
    quantize_inputs(in.x.data(), k, m, k, dots);
    if (offsets) {  // the zero points times the inputs as the products read them
      std::vector<float> read;
      read_inputs(dots, read);
      in = widen_inputs(read.data(), m, k, group, true);
    }
    const __m512i idx = lane_groups(group);
    const int64_t tiles = n / kDotCols;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < tiles; ++b)
      dot_columns<kDotCols>(in, dots, q, scale, zero, group, idx, b * kDotCols, y, n);
    for (int64_t n0 = tiles * kDotCols; n0 < n; ++n0)
      dot_columns<1>(in, dots, q, scale, zero, group, idx, n0, y, n);
    return 0;
  }
#endif
  const int64_t blocks = n / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b)
    weight_rows<kCols>(in, q, scale, zero, group, b * kCols, y, n);
  for (int64_t n0 = blocks * kCols; n0 < n; ++n0)
    weight_rows<1>(in, q, scale, zero, group, n0, y, n);
  return 0;
}

template <typename T>
int dequantize(const int8_t* q, const float* scale, const float* zero, T* out, int64_t n,
               int64_t k, int64_t group) {
  if (group <= 0 || group % kLanes || k % group) return 1;
  const int64_t groups = k / group;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < n; ++row) {
    for (int64_t g = 0; g < groups; ++g) {
      const vf s = splat(scale[row * groups + g]);
      const vf z = splat(zero != nullptr ? zero[row * groups + g] : 0.0f);
      for (int64_t kk = g * group; kk < (g + 1) * group; kk += kLanes)
        store(out + row * k + kk, widen(q + row * k + kk) * s + z);
    }
  }
  return 0;
}

}  // namespace

extern "C" {

// Whether products of k inputs in groups of `group` run on VNNI dot products of
// int8-quantized inputs in this build (int8_dot_cpu.h): 1, else 0.
int radixlm_int8_group_dot(int64_t k, int64_t group) { return dot_takes(k, group) ? 1 : 0; }

// x: (m, k); q: (n, k); scale, zero: (n, k / group), zero null for zero points all 0;
// y: (m, n). Returns 0, or 1 for a group that is no multiple of the vector width or
// does not divide k.
int radixlm_int8_group_gemm_f32(const float* x, const int8_t* q, const float* scale,
                                const float* zero, float* y, int64_t m, int64_t n, int64_t k,
                                int64_t group) {
  return gemm(x, q, scale, zero, y, m, n, k, group);
}

int radixlm_int8_group_gemm_bf16(const uint16_t* x, const int8_t* q, const float* scale,
                                 const float* zero, uint16_t* y, int64_t m, int64_t n, int64_t k,
                                 int64_t group) {
  return gemm(x, q, scale, zero, y, m, n, k, group);
}

// out: (n, k) float32 or bfloat16 (rounded once, to nearest even).
int radixlm_int8_group_dequantize_f32(const int8_t* q, const float* scale, const float* zero,
                                      float* out, int64_t n, int64_t k, int64_t group) {
  return dequantize(q, scale, zero, out, n, k, group);
}

int radixlm_int8_group_dequantize_bf16(const int8_t* q, const float* scale, const float* zero,
                                       uint16_t* out, int64_t n, int64_t k, int64_t group) {
  return dequantize(q, scale, zero, out, n, k, group);
}

}  // extern "C"
