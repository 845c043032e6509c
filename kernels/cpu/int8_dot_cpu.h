// Few-row products of int8 weights in groups on VNNI dot products, llama.cpp's way:
// the inputs are quantized to int8 too, per 32 of a row, and each 4 adjacent
// weight x input byte pairs are summed into one int32 lane by one instruction
// (vpdpbusd: 64 products per 512-bit instruction, where the float path spends a
// widening, a conversion and an FMA per 16).
//
// Weights: codes (N, K) int8, row-major; a float32 scale per group of `group`
// inputs of a row (group 16, 32 or a multiple of 64), and optionally a zero point.
// Inputs: a row x of K float32 values is quantized per 32 as llama.cpp's Q8_0 is:
//
//   dx = max|x| / 127 (float32, true division), xq = round(x / dx) (nearest even;
//   0 where dx is 0), so x ~ xr = xq * dx, and the product is the weights' times xr:
//
//   y[n] = sum_g scale[n][g] * dx(g) * sum_{k in g} q[n][k] xq[k]
//          + zero[n][g] * sum_{k in g} xr[k]
//
// vpdpbusd multiplies unsigned bytes by signed ones: the weights are flipped to
// unsigned (q + 128, one xor of the sign bit), and 128 * sum(xq) of each 16 inputs
// is taken off again by starting the lanes that cover them from -128 * sum(xq).
//
// A 512-bit dot vector covers 64 inputs, 4 to a lane: a lane's 4 inputs share a
// weight group and an input group, so the scales are applied lane by lane (a
// vector of each chunk's scales, gathered once per weight row and once per input
// row) before the lanes are summed at the end.
//
// RADIXLM_INT8_DOT is 1 where the build has AVX512-VNNI (-march=native on such a
// CPU); elsewhere the float kernels stay (radixlm.kernels.cpu.int8_group).

#pragma once

#include <vector>

#include "vector_cpu.h"

#if defined(__AVX512VNNI__) && RADIXLM_VECTOR_BYTES == 64
#define RADIXLM_INT8_DOT 1
#else
#define RADIXLM_INT8_DOT 0
#endif

namespace {

constexpr int64_t kDotChunk = 64;  // inputs per dot vector
constexpr int64_t kDotGroup = 32;  // inputs per activation scale

// Whether the dot products take a product of K inputs in weight groups of `group`.
inline bool dot_takes(int64_t K, int64_t group) {
  return RADIXLM_INT8_DOT && K % kDotChunk == 0 &&
         (group == 16 || group == 32 || (group > 0 && group % kDotChunk == 0));
}

#if RADIXLM_INT8_DOT

// Rows of inputs quantized for the dot products, per 64-input chunk c of row r:
// codes, the 16 lanes' input scales (dx of the chunk's first 32 inputs in lanes
// 0-7, of the next 32 in 8-15) and the lanes' starting values (-128 sum(xq) of
// each 16 inputs in lanes 0, 4, 8, 12; 0 elsewhere).
struct DotInputs {
  std::vector<int8_t> codes;    // (rows, K)
  std::vector<float> scales;    // (rows, K / 64, 16)
  std::vector<int32_t> starts;  // (rows, K / 64, 16)
  int64_t rows = 0, K = 0;
};

// x (rows, K; rows x_stride apart) quantized into `in`, reusing its buffers.
inline void quantize_inputs(const float* x, int64_t x_stride, int64_t rows, int64_t K,
                            DotInputs& in) {
  const int64_t chunks = K / kDotChunk;
  in.rows = rows, in.K = K;
  in.codes.resize(rows * K);
  in.scales.resize(rows * chunks * 16);
  in.starts.assign(rows * chunks * 16, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * x_stride;
    int8_t* q = in.codes.data() + r * K;
    for (int64_t g = 0; g < K / kDotGroup; ++g) {
      const float* xg = xr + g * kDotGroup;
      float amax = 0.0f;
      for (int64_t k = 0; k < kDotGroup; ++k) amax = std::max(amax, std::fabs(xg[k]));
      const float dx = amax / 127.0f;
      int32_t sums[2] = {0, 0};  // of each 16
      for (int64_t k = 0; k < kDotGroup; ++k) {
        const float v = dx > 0.0f ? std::nearbyint(xg[k] / dx) : 0.0f;
        const int8_t c = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
        q[g * kDotGroup + k] = c;
        sums[k / 16] += c;
      }
      const int64_t chunk = g / 2, half = g % 2;  // this group's lanes: 8 * half + [0, 8)
      float* lanes = in.scales.data() + (r * chunks + chunk) * 16 + 8 * half;
      for (int j = 0; j < 8; ++j) lanes[j] = dx;
      int32_t* start = in.starts.data() + (r * chunks + chunk) * 16 + 8 * half;
      start[0] = -128 * sums[0];
      start[4] = -128 * sums[1];
    }
  }
}

// The inputs as the products read them, xr = xq * dx: (rows, K) float32 into `out`.
inline void read_inputs(const DotInputs& in, std::vector<float>& out) {
  const int64_t chunks = in.K / kDotChunk;
  out.resize(in.rows * in.K);
  for (int64_t r = 0; r < in.rows; ++r)
    for (int64_t k = 0; k < in.K; ++k) {
      const int64_t g = k / kDotGroup;
      const float dx = in.scales[(r * chunks + g / 2) * 16 + 8 * (g % 2)];
      out[r * in.K + k] = float(in.codes[r * in.K + k]) * dx;
    }
}

// The lane -> weight group index within a chunk (lane i covers inputs 4i..4i+3):
// group 16 -> i / 4, group 32 -> i / 8, one group for the chunk otherwise.
inline __m512i lane_groups(int64_t group) {
  alignas(64) int32_t idx[16];
  for (int i = 0; i < 16; ++i) idx[i] = group < kDotChunk ? 4 * i / static_cast<int>(group) : 0;
  return _mm512_load_si512(idx);
}

// y[r][c] (r < R, c < C) = rows [m0, m0 + R) of the inputs . weight rows
// [n0, n0 + C), scaled (zero points left to the caller): R C accumulators, each
// weight vector serving R input rows and each input vector C weight rows. kOneGroup:
// a row's scale is one for all its inputs (int8 per row), applied once at the end.
template <int R, int C, bool kOneGroup>
void dot_tile_of(const DotInputs& in, const int8_t* codes, const float* scale, int64_t group,
                 __m512i idx, int64_t m0, int64_t n0, float y[R][C]) {
  const int64_t K = in.K, chunks = K / kDotChunk, groups = K / group;
  const int per_chunk = group < kDotChunk ? static_cast<int>(kDotChunk / group) : 1;
  const __mmask16 scale_lanes = static_cast<__mmask16>((1u << per_chunk) - 1);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const int64_t ahead = tile_ahead<C>(K, 16 * kDotChunk);
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t k0 = chunk * kDotChunk, g0 = k0 / group;
    __m512i w[C];
    __m512 ws[C];
    for (int c = 0; c < C; ++c) {
      const int8_t* row = codes + (n0 + c) * K + k0;
      // 1 KB ahead at least, into L2, at the same k of a tile to come (tile_ahead): the
      // LM head of a 151,936 x 2,048 vocabulary (311 MB, one row) read at 19.3 GB/s,
      // 16.2 at 512 bytes ahead, 17.8 at 256 (EPYC-512)
      __builtin_prefetch(row + ahead, 0, 2);
      w[c] = _mm512_xor_si512(_mm512_loadu_si512(row), flip);
      if constexpr (!kOneGroup) {
        const __m512 s = _mm512_maskz_loadu_ps(scale_lanes, scale + (n0 + c) * groups + g0);
        ws[c] = _mm512_permutexvar_ps(idx, s);
      }
    }
    for (int r = 0; r < R; ++r) {
      const int64_t at = ((m0 + r) * chunks + chunk) * 16;
      const __m512i xq = _mm512_loadu_si512(in.codes.data() + (m0 + r) * K + k0);
      const __m512i start = _mm512_loadu_si512(in.starts.data() + at);
      const __m512 dx = _mm512_loadu_ps(in.scales.data() + at);
      for (int c = 0; c < C; ++c) {
        const __m512i dot = _mm512_dpbusd_epi32(start, w[c], xq);
        __m512 lane_scale = dx;
        if constexpr (!kOneGroup) lane_scale = _mm512_mul_ps(ws[c], dx);
        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), lane_scale, acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      y[r][c] = _mm512_reduce_add_ps(acc[r][c]) * (kOneGroup ? scale[n0 + c] : 1.0f);
}

// dot_tile_of for one input row: the C weight rows one after another, each a single
// stream the prefetchers follow, where the tiles interleave C streams. The operations
// and their order per (row, weight row) are the tiles', so the result is bit for bit
// theirs. The LM head of a 151,936 x 2,048 vocabulary (311 MB), int8 per row, one
// input row, 2 threads, EPYC-512, alternating runs: 12.2 / 11.2 / 14.0 ms against
// 19.8 / 18.7 / 13.8 for 4 interleaved rows. 4 KB ahead was the best distance in a
// stand-alone loop of this shape (1 KB and 2 KB 5-10% slower).
template <int C, bool kOneGroup>
void dot_rows_of(const DotInputs& in, const int8_t* codes, const float* scale, int64_t group,
                 __m512i idx, int64_t m, int64_t n0, float y[1][C]) {
  const int64_t K = in.K, chunks = K / kDotChunk, groups = K / group;
  const int per_chunk = group < kDotChunk ? static_cast<int>(kDotChunk / group) : 1;
  const __mmask16 scale_lanes = static_cast<__mmask16>((1u << per_chunk) - 1);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const int8_t* xq = in.codes.data() + m * K;
  const int32_t* starts = in.starts.data() + m * chunks * 16;
  const float* dx = in.scales.data() + m * chunks * 16;
  for (int c = 0; c < C; ++c) {
    const int8_t* row = codes + (n0 + c) * K;
    const float* row_scale = scale + (n0 + c) * groups;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const int64_t k0 = chunk * kDotChunk;
      __builtin_prefetch(row + k0 + kRowPrefetch, 0, 2);
      const __m512i w = _mm512_xor_si512(_mm512_loadu_si512(row + k0), flip);
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_loadu_si512(starts + chunk * 16), w,
                                              _mm512_loadu_si512(xq + k0));
      __m512 lane_scale = _mm512_loadu_ps(dx + chunk * 16);
      if constexpr (!kOneGroup) {
        const __m512 s = _mm512_maskz_loadu_ps(scale_lanes, row_scale + k0 / group);
        lane_scale = _mm512_mul_ps(_mm512_permutexvar_ps(idx, s), lane_scale);
      }
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), lane_scale, acc);
    }
    y[0][c] = _mm512_reduce_add_ps(acc) * (kOneGroup ? scale[n0 + c] : 1.0f);
  }
}

template <int R, int C>
void dot_tile(const DotInputs& in, const int8_t* codes, const float* scale, int64_t group,
              __m512i idx, int64_t m0, int64_t n0, float y[R][C]) {
  if constexpr (R == 1) {
    if (group >= in.K)
      dot_rows_of<C, true>(in, codes, scale, group, idx, m0, n0, y);
    else
      dot_rows_of<C, false>(in, codes, scale, group, idx, m0, n0, y);
  } else if (group >= in.K) {
    dot_tile_of<R, C, true>(in, codes, scale, group, idx, m0, n0, y);
  } else {
    dot_tile_of<R, C, false>(in, codes, scale, group, idx, m0, n0, y);
  }
}

// Tiles of kDotRows input rows and kDotCols weight rows (16 accumulators).
constexpr int kDotRows = 4;
constexpr int kDotCols = 4;

#endif  // RADIXLM_INT8_DOT

}  // namespace
