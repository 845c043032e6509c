// Few-row forward kernels for CPU decode steps (float32 or bfloat16 weights).
//
// A decode step of one request (or a few) reads every weight once for a handful
// of rows: it is a memory stream, and on a small CPU what it loses besides the
// stream is the glue around it (dozens of small ops per layer, each its own
// dispatch and OpenMP fork/join). The entry points:
//
//   linear:        y = x W^T + b for any number of rows (computed 8 at a time)
//   attention_in:  residual += hidden; x = rmsnorm(residual); qkv = x Wqkv^T + b;
//                  per-head q/k rmsnorm (optional); RoPE on q and k
//   mlp:           o = attn Wo^T + b; residual += o; x = rmsnorm(residual);
//                  out = (silu(x Wg^T) * (x Wu^T)) Wd^T   (biases optional)
//   decode_step:   every layer of a decode step (attention_in, K/V into the
//                  pool, decode attention, mlp) and the final norm, in one call;
//                  over a float pool or a quantized one (the new K/V quantized
//                  per head as kv_quant.quantize does: quantize_head)
//
// and, for the eager model's passes of any size (kernels/elementwise.py),
// add_rms_norm, rope and silu_mul: the elementwise steps as single passes.
//
// attention_in and mlp are one OpenMP parallel region each, with barriers
// between their phases.
//
// Weights are the Linear layer's layout: (out, in) contiguous, float32, or bfloat16
// read as float32 (half the bytes to stream). A thread owns a range of weight rows
// (output columns) and reads them one after another, a few at a time against up to
// eight input rows (row_tile), each weight row a stream prefetched ahead; every
// output is a dot product summed in the same order whatever rows share the call
// and however many threads there are (batch-invariant, bit for bit).
//
// Measured on a 2-core AMD EPYC with AVX-512, bfloat16 weights of a
// Llama-3.2-1B-shaped model's 16 layers (1.95 GB, from memory): one row 67-70 ms
// (~28 GB/s, the machine's streaming read), where the input-major column blocks
// this kernel read before took 96-101 ms; 8 rows 138-140 against 147-159 ms.
//
// Built by radixlm.kernels.native for AVX2 or AVX-512 (vector_cpu.h); the OpenMP
// runtime is torch's own (see decode_attention_cpu.cpp).

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "decode_attention_cpu.cpp"  // decode_attention<float>, for the whole-step entry point

namespace {

constexpr int kMaxRows = 8;  // rows of x per pass over the weights

// Whether bfloat16 weights take AVX512-BF16 dot products (row_tile_bf16;
// RADIXLM_BF16_DOT, vector_cpu.h).
constexpr bool kBf16Dot = RADIXLM_BF16_DOT;

// Weights are float32 (float) or bfloat16 (uint16_t), read with to_float
// (decode_attention_cpu.cpp); activations and sums are float32 either way.

// n float32 values to bfloat16 (round to nearest even), and back.
void to_storage(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store(dst + i, load(src + i));
  for (; i < n; ++i) {  // the vector path's rounding, one value at a time
    uint16_t lane[kLanes];
    vf v = {};
    v[0] = src[i];
    store(lane, v);
    dst[i] = lane[0];
  }
}

void from_storage(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store(dst + i, load(src + i));
  for (; i < n; ++i) dst[i] = to_float(src[i]);
}

// A matrix product's operands: y[m, c] = sum_i x[m, i] wt[c, i] + bias[c]. The
// matrix is W values (out, in) contiguous, or another operand (Mat) whose
// product_share overload is found where it is defined (small_batch_quant_cpu.cpp).
template <typename W, typename Mat = const W*>
struct Product {
  const float* x;
  int64_t x_stride;  // between rows of x
  Mat wt;            // const W*: (out, in) contiguous
  const W* bias;     // (out,) or null
  float* y;
  int64_t y_stride;
  int64_t in;
  int64_t out;
};

// Weight rows [r, r + R) (output columns) for input rows [0, M) starting at x: one
// vector accumulator per (weight row, input row), over the inputs kLanes at a time
// in order; then its lanes summed by halving (hsum), the inputs past the last whole
// vector added one by one, and the bias. That is each output's order of operations
// whatever M and R are, so a row's result does not depend on the rows beside it.
// Each weight row is a stream prefetched about kRowPrefetch bytes ahead, a cache
// line at a time (tile_ahead).
template <typename W, int M, int R>
void row_tile(const Product<W>& p, const float* x, float* y, int64_t r) {
  constexpr int64_t kLine = 64 / sizeof(W);  // weights per cache line
  const int64_t K = p.in;
  const int64_t whole = K / kLanes * kLanes;
  const W* w = p.wt + r * K;
  const int64_t ahead = tile_ahead<R>(K, kRowPrefetch / int64_t(sizeof(W)));
  vf acc[R][M] = {};
  for (int64_t k = 0; k < whole; k += kLanes) {
    if (k % kLine == 0) {
      for (int q = 0; q < R; ++q) __builtin_prefetch(w + q * K + k + ahead, 0, 2);
    }
    vf wv[R];
    for (int q = 0; q < R; ++q) wv[q] = load(w + q * K + k);
    for (int m = 0; m < M; ++m) {
      const vf xv = load(x + m * p.x_stride + k);
      for (int q = 0; q < R; ++q) acc[q][m] += wv[q] * xv;
    }
  }
  for (int q = 0; q < R; ++q) {
    const float bias = p.bias ? to_float(p.bias[r + q]) : 0.0f;
    for (int m = 0; m < M; ++m) {
      float sum = hsum(acc[q][m]);
      for (int64_t k = whole; k < K; ++k) sum += x[m * p.x_stride + k] * to_float(w[q * K + k]);
      y[m * p.y_stride + r + q] = sum + bias;
    }
  }
}

// Weight rows per tile for M input rows: R x M accumulators, R weight vectors and an
// input vector in the ISA's registers. One row reads one weight row at a time: a
// single stream per thread, which the prefetchers follow best. Measured on an AMD
// EPYC with AVX-512 (2 cores), bfloat16 weights of a Llama-3.2-1B-shaped model's 16
// layers (1.95 GB), against the input-major column blocks this kernel used before:
// 1 row 67-70 against 96-101 ms, 2 rows 84 (R = 4) against 101-107, 4 rows 84
// against 87-91, 8 rows 138-140 (R = 2 or 4) against 147-159 (R = 1 at 8 rows:
// 233, the inputs reloaded for every weight row).
//
// Bfloat16 weights on dot products (row_tile_bf16) take input rows 6 at a time, in
// tiles of 4 weight rows by up to 6 input rows (24 accumulators), which read fewer
// operands per product than 2 by 8. Measured there (the 1.95 GB above, 2 threads):
// 16 rows 67.5 against 93.6 ms, 32 rows 111 against 148 (with the farther prefetch
// of row_tile_bf16). A pass of 7 or 8 input rows is one chunk, in tiles of 3 weight
// rows by 7-8 inputs (24 accumulators), where 6 and then 2 went over each block of
// weights twice: 16 matrices each of the 1B shape's, 7 rows 41.6 against 33.8 ms, 8
// rows 42.0 against 36.4; its 128,256 x 2,048 LM head at 8 rows 16.2 against 14.6.
template <typename W>
constexpr bool kDotTiles = kBf16Dot && std::is_same_v<W, uint16_t>;

template <typename W, int M>
constexpr int tile_rows() {
  if constexpr (M == 1) return 1;
  if constexpr (kDotTiles<W>) return M == 2 ? 1 : (M <= 4 ? 2 : (M <= 6 ? 4 : 3));
  if constexpr (kLanes == 16) return M <= 4 ? 4 : 2;
  return M == 2 ? 4 : (M <= 4 ? 2 : 1);
}

// Input rows per chunk of a pass of more than kMaxRows rows (one chunk up to that).
template <typename W>
constexpr int chunk_rows() {
  return kDotTiles<W> ? 6 : kMaxRows;
}

#if RADIXLM_BF16_DOT
// row_tile for bfloat16 weights on AVX512-BF16 dot products: the inputs rounded to
// bfloat16 (xb, M rows of K), and each vdpbf16ps adds 32 products (two a lane)
// where an FMA adds 16; the products of two bfloat16 values are exact in float32.
// As row_tile: per output the same order of operations whatever M and R are. The
// weights are prefetched 8 KB ahead: with several input rows a line takes longer
// to consume (8 rows: 48-56 against 54-63 ms at 4 KB).
template <int M, int R>
void row_tile_bf16(const Product<uint16_t>& p, const uint16_t* xb, float* y, int64_t r) {
  constexpr int64_t kStep = 32;  // inputs per dot instruction, one cache line of weights
  const int64_t K = p.in;
  const int64_t whole = K / kStep * kStep;
  const uint16_t* w = p.wt + r * K;
  const int64_t ahead = tile_ahead<R>(K, 2 * kRowPrefetch / int64_t(sizeof(uint16_t)));
  __m512 acc[R][M];
  for (int q = 0; q < R; ++q)
    for (int m = 0; m < M; ++m) acc[q][m] = _mm512_setzero_ps();
  for (int64_t k = 0; k < whole; k += kStep) {
    __m512bh wv[R];
    for (int q = 0; q < R; ++q) {
      __builtin_prefetch(w + q * K + k + ahead, 0, 2);
      wv[q] = (__m512bh)_mm512_loadu_si512(w + q * K + k);
    }
    for (int m = 0; m < M; ++m) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(xb + m * K + k);
      for (int q = 0; q < R; ++q) acc[q][m] = _mm512_dpbf16_ps(acc[q][m], xv, wv[q]);
    }
  }
  for (int q = 0; q < R; ++q) {
    const float bias = p.bias ? to_float(p.bias[r + q]) : 0.0f;
    for (int m = 0; m < M; ++m) {
      float sum = hsum(vf(acc[q][m]));
      for (int64_t k = whole; k < K; ++k)
        sum += to_float(xb[m * K + k]) * to_float(w[q * K + k]);
      y[m * p.y_stride + r + q] = sum + bias;
    }
  }
}
#endif

// Weight rows [r0, r1) for M input rows: whole tiles, then one row at a time. x_bf16:
// the inputs rounded to bfloat16 (M rows of p.in) where bfloat16 weights take the dot
// products, else null.
template <typename W, int M>
void rows_of(const Product<W>& p, const float* x, const uint16_t* x_bf16, float* y, int64_t r0,
             int64_t r1) {
  constexpr int R = tile_rows<W, M>();
#if RADIXLM_BF16_DOT
  if constexpr (std::is_same_v<W, uint16_t>) {
    int64_t r = r0;
    for (; r + R <= r1; r += R) row_tile_bf16<M, R>(p, x_bf16, y, r);
    for (; r < r1; ++r) row_tile_bf16<M, 1>(p, x_bf16, y, r);
    return;
  }
#endif
  (void)x_bf16;
  int64_t r = r0;
  for (; r + R <= r1; r += R) row_tile<W, M, R>(p, x, y, r);
  if constexpr (R > 1) {
    for (; r < r1; ++r) row_tile<W, M, 1>(p, x, y, r);
  }
}

// Rows [0, rows) of x (x_stride apart, K values each) rounded to bfloat16 into this
// thread's buffer, packed `stride` apart (at least K; the values past K zeros): the
// inputs of bfloat16 dot products.
inline const uint16_t* inputs_as_bf16(const float* x, int64_t x_stride, int64_t rows, int64_t K,
                                      int64_t stride) {
  thread_local std::vector<uint16_t> buffer;
  buffer.resize(rows * stride);
  for (int64_t m = 0; m < rows; ++m) {
    uint16_t* row = buffer.data() + m * stride;
    to_storage(x + m * x_stride, row, K);
    std::fill(row + K, row + stride, uint16_t(0));
  }
  return buffer.data();
}

// Weight rows [r0, r1) against input rows [0, rows), chunk_rows<W> at a time. x_bf16: as
// rows_of's, all the rows (K = p.in apart).
template <typename W>
void rows_by_chunks(const Product<W>& p, const uint16_t* x_bf16, int64_t rows, int64_t r0,
                    int64_t r1) {
  const int64_t chunk = rows <= kMaxRows ? rows : chunk_rows<W>();
  for (int64_t m0 = 0; m0 < rows; m0 += chunk) {
    const float* x = p.x + m0 * p.x_stride;
    const uint16_t* xb = x_bf16 ? x_bf16 + m0 * p.in : nullptr;
    float* y = p.y + m0 * p.y_stride;
    switch (std::min<int64_t>(chunk, rows - m0)) {
      case 1: rows_of<W, 1>(p, x, xb, y, r0, r1); break;
      case 2: rows_of<W, 2>(p, x, xb, y, r0, r1); break;
      case 3: rows_of<W, 3>(p, x, xb, y, r0, r1); break;
      case 4: rows_of<W, 4>(p, x, xb, y, r0, r1); break;
      case 5: rows_of<W, 5>(p, x, xb, y, r0, r1); break;
      case 6: rows_of<W, 6>(p, x, xb, y, r0, r1); break;
      case 7: rows_of<W, 7>(p, x, xb, y, r0, r1); break;
      default: rows_of<W, 8>(p, x, xb, y, r0, r1); break;
    }
  }
}

// Bytes of weight rows every chunk of input rows goes over while they stay in L2
// (32, 128 and 512 KB measured alike, 1-32 rows of the 1B shape's bfloat16 layers).
constexpr int64_t kWeightBlockBytes = 128 * 1024;

// This thread's share of the product for rows [0, rows): weight rows (output
// columns) split in units of four; a block of them at a time (a multiple of 12 rows:
// whole tiles of 3 or 4 weight rows, no row left to a one-row tile), which every chunk
// of input rows reads while it is cached, so the weights come from memory once
// whatever the number of rows.
template <typename W>
void product_share(const Product<W>& p, int64_t rows, int thread, int threads) {
  const int64_t units = (p.out + 3) / 4;
  const int64_t r0 = units * thread / threads * 4;
  const int64_t r1 = std::min(p.out, units * (thread + 1) / threads * 4);
  if (r0 >= r1 || rows == 0) return;
  const uint16_t* xb =
      kDotTiles<W> ? inputs_as_bf16(p.x, p.x_stride, rows, p.in, p.in) : nullptr;
  const int64_t block =
      std::max<int64_t>(12, kWeightBlockBytes / (p.in * int64_t(sizeof(W))) / 12 * 12);
  for (int64_t b = r0; b < r1; b += block) rows_by_chunks(p, xb, rows, b, std::min(r1, b + block));
}

float sum_of_squares(const float* x, int64_t n) {
  vf acc = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const vf v = load(x + i);
    acc += v * v;
  }
  float s = 0.0f;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  for (; i < n; ++i) s += x[i] * x[i];
  return s;
}

// out = x / sqrt(mean(x^2) + eps) * weight (out may be x).
template <typename W>
void rms_norm(const float* x, const W* weight, float eps, float* out, int64_t n) {
  const float scale = 1.0f / std::sqrt(sum_of_squares(x, n) / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * to_float(weight[i]);
}

// Rows of residual (+= add, when given), normed into out; rows split over threads.
template <typename W>
void add_and_norm_share(float* residual, const float* add, const W* weight, float eps,
                        float* out, int64_t rows, int64_t n, int thread, int threads) {
  for (int64_t m = thread; m < rows; m += threads) {
    float* r = residual + m * n;
    if (add) {
      const float* a = add + m * n;
      for (int64_t i = 0; i < n; ++i) r[i] += a[i];
    }
    rms_norm(r, weight, eps, out + m * n, n);
  }
}

// silu(gate) * up over n values, written to out (may be gate): vectorized, with
// sigmoid(g) = 1 / (1 + e) for g >= 0 and e / (1 + e) below, e = exp(-|g|).
void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const vf g = load(gate + i);
    const vf e = exp_nonpositive(g < 0.0f ? g : -g);
    const vf sigmoid = (g < 0.0f ? e : splat(1.0f)) / (e + 1.0f);
    store(out + i, g * sigmoid * load(up + i));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

// RoPE (rotate-half form) on one head of head_dim values, after an optional
// RMSNorm with weight norm (null: none).
template <typename W>
void norm_and_rotate(float* x, const W* norm, float eps, const float* cos, const float* sin,
                     int64_t head_dim) {
  if (norm) rms_norm(x, norm, eps, x, head_dim);
  const int64_t half = head_dim / 2;
  for (int64_t j = 0; j < half; ++j) {
    const float x1 = x[j], x2 = x[j + half];
    x[j] = x1 * cos[j] - x2 * sin[j];
    x[j + half] = x2 * cos[j] + x1 * sin[j];
  }
}

// gate_up rows ([gate | up], 2 I wide): gate = silu(gate) * up; this thread's
// share of every row (rows are few in a decode step, and long).
void silu_mul_share(float* gate_up, int64_t rows, int64_t intermediate, int thread,
                    int threads) {
  const int64_t units = (intermediate + kLanes - 1) / kLanes;
  const int64_t begin = units * thread / threads * kLanes;
  const int64_t end = std::min(intermediate, units * (thread + 1) / threads * kLanes);
  for (int64_t m = 0; m < rows && begin < end; ++m) {
    float* g = gate_up + m * 2 * intermediate;
    silu_mul(g + begin, g + intermediate + begin, g + begin, end - begin);
  }
}

// The first half of a layer (see radixlm_small_attention_in_f32).
template <typename W, typename Mat = const W*>
void attention_in(float* residual, const float* hidden, const W* norm_weight, float eps,
                  Mat wt_qkv, const W* bias_qkv, const W* q_norm, const W* k_norm,
                  const float* cos, const float* sin, float* normed,
                  float* qkv, int64_t rows, int64_t hidden_size, int64_t heads, int64_t kv_heads,
                  int64_t head_dim) {
  const int64_t width = (heads + 2 * kv_heads) * head_dim;
  const int64_t half = head_dim / 2;
  const Product<W, Mat> p{normed, hidden_size, wt_qkv, bias_qkv, qkv, width, hidden_size, width};
#pragma omp parallel
  {
    const int thread = omp_get_thread_num(), threads = omp_get_num_threads();
    add_and_norm_share(residual, hidden, norm_weight, eps, normed, rows, hidden_size, thread,
                       threads);
#pragma omp barrier
    product_share(p, rows, thread, threads);
#pragma omp barrier
    const int64_t rotated = heads + kv_heads;  // q and k heads of a row
    for (int64_t item = thread; item < rows * rotated; item += threads) {
      const int64_t m = item / rotated, h = item % rotated;
      norm_and_rotate(qkv + m * width + h * head_dim, h < heads ? q_norm : k_norm, eps,
                      cos + m * half, sin + m * half, head_dim);
    }
  }
}

// The second half of a layer (see radixlm_small_mlp_f32).
template <typename W, typename Mat = const W*>
void mlp(const float* attn, Mat wt_o, const W* bias_o, float* residual, const W* norm_weight,
         float eps, Mat wt_gate_up, const W* bias_gate_up, Mat wt_down,
         const W* bias_down, float* scratch, float* gate_up, float* out, int64_t rows,
         int64_t hidden_size, int64_t attn_dim, int64_t intermediate) {
  const int64_t width = 2 * intermediate;
  const Product<W, Mat> o_proj{attn,        attn_dim, wt_o, bias_o, scratch, hidden_size, attn_dim,
                          hidden_size};
  const Product<W, Mat> up{scratch, hidden_size, wt_gate_up, bias_gate_up, gate_up, width, hidden_size,
                      width};
  const Product<W, Mat> down{gate_up, width, wt_down, bias_down, out, hidden_size, intermediate,
                        hidden_size};
#pragma omp parallel
  {
    const int thread = omp_get_thread_num(), threads = omp_get_num_threads();
    product_share(o_proj, rows, thread, threads);
#pragma omp barrier
    add_and_norm_share(residual, scratch, norm_weight, eps, scratch, rows, hidden_size, thread,
                       threads);
#pragma omp barrier
    product_share(up, rows, thread, threads);
#pragma omp barrier
    // silu(gate) * up, written over gate: the down projection reads it in place.
    silu_mul_share(gate_up, rows, intermediate, thread, threads);
#pragma omp barrier
    product_share(down, rows, thread, threads);
  }
}

// Over a quantized pool (decode_attention_codes_cpu.cpp): declared here, defined
// where small_batch_codes_cpu.cpp instantiates decode_step for codes, so that this
// file's float library holds the float kernels alone (see that file).
template <typename T, typename KV>
int decode_attention_codes(const T* q, int64_t q_stride, const KV* k, const KV* v,
                           const int64_t* table, int64_t table_stride, const int64_t* rows,
                           const int64_t* prefix_lens, const T* k_new, int64_t k_new_stride,
                           const T* v_new, int64_t v_new_stride, T* out, int64_t out_stride,
                           int64_t B, int64_t H, int64_t Hkv, int64_t D, float scale,
                           int64_t window, float softcap, const uint16_t* k_scale,
                           const uint16_t* v_scale);

// Quantizing a new token's K/V for a quantized pool, exactly as
// radixlm.runtime.mem_cache.kv_quant.quantize does (bit for bit: the tests hold it
// to that): per head vector x, scale = max|x| / max_code in float32 (true division)
// rounded to bfloat16 (nearest even, to_bfloat16), and code = x / scale with that
// rounded scale widened (true division; 1 for a scale of 0) rounded to nearest even:
// int8 clamped to +-127, fp8 cast after clamping to the format's largest value (a
// scale rounded down puts the largest magnitude up to 2^-8 of itself past it).
template <typename C>
constexpr float kMaxCode = std::is_same_v<C, int8_t> ? 127.0f
                           : std::is_same_v<C, Fp8E4M3> ? 448.0f
                                                        : 57344.0f;

// y (|y| <= the format's largest value, not NaN) to fp8 with E exponent and M
// mantissa bits, rounded to nearest even; subnormals are multiples of 2^(1 - bias - M).
template <int E, int M>
uint8_t fp8_bits(float y) {
  constexpr int kBias = (1 << (E - 1)) - 1;
  uint32_t u;
  std::memcpy(&u, &y, sizeof u);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  u &= 0x7fffffffu;
  if (u < (uint32_t(127 - kBias + 1) << 23)) {  // below the smallest normal, 2^(1 - bias)
    float a;
    std::memcpy(&a, &u, sizeof a);
    return sign | uint8_t(std::nearbyint(a * float(1u << (kBias - 1 + M))));  // exact scaling
  }
  constexpr int kShift = 23 - M;
  u += ((1u << (kShift - 1)) - 1) + ((u >> kShift) & 1u);  // round the dropped bits, ties even
  return sign | uint8_t((u >> kShift) - (uint32_t(127 - kBias) << M));
}

inline int8_t encode(float y, int8_t*) {
  return int8_t(std::clamp(std::nearbyint(y), -127.0f, 127.0f));
}
inline Fp8E4M3 encode(float y, Fp8E4M3*) {
  return Fp8E4M3{fp8_bits<4, 3>(std::clamp(y, -448.0f, 448.0f))};
}
inline Fp8E5M2 encode(float y, Fp8E5M2*) {
  return Fp8E5M2{fp8_bits<5, 2>(std::clamp(y, -57344.0f, 57344.0f))};
}

// One head vector x (D values of the pool's float type W) into codes and its
// bfloat16 scale.
template <typename C, typename W>
void quantize_head(const W* x, int64_t D, C* codes, uint16_t* scale) {
  float amax = 0.0f;
  for (int64_t d = 0; d < D; ++d) amax = std::max(amax, std::fabs(to_float(x[d])));
  *scale = to_bfloat16(amax / kMaxCode<C>);
  const float wide = to_float(*scale);
  const float safe = wide > 0.0f ? wide : 1.0f;
  for (int64_t d = 0; d < D; ++d) codes[d] = encode(to_float(x[d]) / safe, static_cast<C*>(nullptr));
}

// A code's value: int8 as it is; fp8 with E exponent and M mantissa bits (never
// NaN or infinite here: encode clamps to the format's largest value).
inline float code_value(int8_t c) { return float(c); }
template <int E, int M>
float fp8_value(uint8_t bits) {
  constexpr int kBias = (1 << (E - 1)) - 1;
  const int exponent = (bits >> M) & ((1 << E) - 1), mantissa = bits & ((1 << M) - 1);
  const float magnitude = exponent == 0
                              ? std::ldexp(float(mantissa), 1 - kBias - M)
                              : std::ldexp(float((1 << M) | mantissa), exponent - kBias - M);
  return (bits & 0x80u) ? -magnitude : magnitude;
}
inline float code_value(Fp8E4M3 c) { return fp8_value<4, 3>(c.bits); }
inline float code_value(Fp8E5M2 c) { return fp8_value<5, 2>(c.bits); }

constexpr int64_t kMaxHeadDimStored = 512;  // decode_step refuses wider heads

// x (D values of W) replaced by the values its codes and scale stand for, as
// kv_quant.dequantize gives them: code x scale in float32, rounded once to W.
template <typename W, typename C>
void as_stored(W* x, const C* codes, float scale, int64_t D) {
  float values[kMaxHeadDimStored];
  for (int64_t d = 0; d < D; ++d) values[d] = code_value(codes[d]) * scale;
  if constexpr (std::is_same_v<W, float>)
    std::memcpy(x, values, D * sizeof(float));
  else
    to_storage(values, x, D);
}

// A layer's K (or V) of the pass's new tokens into the pool at their slots:
// copied for a float pool (KV = W), quantized per head for a quantized one, whose
// new tokens are then attended as stored (x replaced by its codes' values), as
// every backend's pass attends its own tokens.
template <typename W, typename KV>
void store_new(W* x, int64_t x_stride, const int64_t* out_loc, int64_t rows,
               int64_t kv_heads, int64_t D, KV* pool, uint16_t* scales) {
  for (int64_t m = 0; m < rows; ++m) {
    W* xm = x + m * x_stride;
    if constexpr (kIsCode<KV>) {
      for (int64_t h = 0; h < kv_heads; ++h) {
        KV* codes = pool + (out_loc[m] * kv_heads + h) * D;
        uint16_t* scale = scales + out_loc[m] * kv_heads + h;
        quantize_head(xm + h * D, D, codes, scale);
        as_stored(xm + h * D, codes, to_float(*scale), D);
      }
    } else {
      std::memcpy(pool + out_loc[m] * kv_heads * D, xm, kv_heads * D * sizeof(W));
    }
  }
}

// One layer's tensors, in the order of DecoderLayerWeights.pointers() (null = absent);
// the four matrices are Mat operands (W values, or small_batch_quant_cpu.cpp's).
template <typename W, typename Mat = const W*>
struct Layer {
  const W* input_norm;
  Mat qkv;
  const W* qkv_bias;
  const W* q_norm;
  const W* k_norm;
  Mat o;
  const W* o_bias;
  const W* post_norm;
  Mat gate_up;
  const W* gate_up_bias;
  Mat down;
  const W* down_bias;
};
static_assert(sizeof(Layer<float>) == 12 * sizeof(const float*), "Layer is 12 pointers");

// A Layer's attention half and its MLP as decode_step reads them: a layer type of
// another MLP (small_batch_quant_cpu.cpp's MoeLayer) brings its own overloads, found
// by argument-dependent lookup where decode_step is instantiated.
template <typename W, typename Mat>
const Layer<W, Mat>& attention_part(const Layer<W, Mat>& w) {
  return w;
}

// The layer's second half: hidden (out) from the attention output. Returns 0.
template <typename W, typename Mat>
int layer_mlp(const Layer<W, Mat>& w, const float* attn, float* residual, float eps,
              float* scratch, float* gate_up, float* out, int64_t rows, int64_t hidden_size,
              int64_t attn_dim, int64_t intermediate) {
  mlp<W, Mat>(attn, w.o, w.o_bias, residual, w.post_norm, eps, w.gate_up, w.gate_up_bias,
              w.down, w.down_bias, scratch, gate_up, out, rows, hidden_size, attn_dim,
              intermediate);
  return 0;
}

// See radixlm_small_decode_step_f32. With bfloat16 weights the KV pool is
// bfloat16 too: q, k and v are rounded to it for the pool and the attention
// kernel, whose output comes back to float32 for the MLP. A quantized pool (KV a
// code type, k_scales/v_scales its (layers, slots, Hkv) bfloat16 scales) gets those
// rounded K/V quantized per head (quantize_head), as KVPool.write would store them.
template <typename W, typename KV = W, typename Mat = const W*, typename L = Layer<W, Mat>>
int decode_step(const L* layers, int64_t num_layers, const W* final_norm, float eps,
                float* residual, const float* cos, const float* sin, KV* k_pool, KV* v_pool,
                int64_t pool_layer_stride, const int64_t* table, int64_t table_stride,
                const int64_t* rows_of, const int64_t* prefix_lens, const int64_t* out_loc,
                float* out, int64_t rows, int64_t hidden_size, int64_t heads, int64_t kv_heads,
                int64_t head_dim, int64_t intermediate, float scale,
                uint16_t* k_scales = nullptr, uint16_t* v_scales = nullptr,
                int64_t scale_layer_stride = 0) {
  if (head_dim % 2 || head_dim > kMaxHeadDimStored) return 1;
  if constexpr (kIsCode<KV>) {
    if (k_scales == nullptr || v_scales == nullptr) return 1;
  }
  constexpr bool kFloat = std::is_same_v<W, float>;
  const int64_t width = (heads + 2 * kv_heads) * head_dim, attn_dim = heads * head_dim;
  const int64_t kv_dim = kv_heads * head_dim;
  const int64_t floats = rows * (3 * hidden_size + width + attn_dim + 2 * intermediate);
  const int64_t stored = kFloat ? 0 : rows * (width + attn_dim);  // W copies of qkv and attn
  float* buffer = static_cast<float*>(std::malloc((floats + 1) * sizeof(float)));
  W* stored_buffer = static_cast<W*>(std::malloc((stored + 1) * sizeof(W)));
  if (buffer == nullptr || stored_buffer == nullptr) {
    std::free(buffer);
    std::free(stored_buffer);
    return 2;
  }
  float* normed = buffer;  // (rows, hidden_size), also the MLP's scratch
  float* hidden = normed + rows * hidden_size;
  float* qkv = hidden + rows * hidden_size;
  float* attn = qkv + rows * width;
  float* gate_up = attn + rows * attn_dim;
  int status = 0;
  for (int64_t l = 0; l < num_layers && status == 0; ++l) {
    const Layer<W, Mat>& w = attention_part(layers[l]);
    attention_in<W, Mat>(residual, l ? hidden : nullptr, w.input_norm, eps, w.qkv, w.qkv_bias,
                    w.q_norm, w.k_norm, cos, sin, normed, qkv, rows, hidden_size, heads, kv_heads,
                    head_dim);
    const W* qkv_stored;
    W* attn_stored;
    if constexpr (kFloat) {
      qkv_stored = qkv;
      attn_stored = attn;
    } else {
      to_storage(qkv, stored_buffer, rows * width);
      qkv_stored = stored_buffer;
      attn_stored = stored_buffer + rows * width;
    }
    KV* k_layer = k_pool + l * pool_layer_stride;
    KV* v_layer = v_pool + l * pool_layer_stride;
    uint16_t* k_scale = k_scales == nullptr ? nullptr : k_scales + l * scale_layer_stride;
    uint16_t* v_scale = v_scales == nullptr ? nullptr : v_scales + l * scale_layer_stride;
    W* kv_new = const_cast<W*>(qkv_stored) + attn_dim;  // qkv or stored_buffer: ours
    store_new(kv_new, width, out_loc, rows, kv_heads, head_dim, k_layer, k_scale);
    store_new(kv_new + kv_dim, width, out_loc, rows, kv_heads, head_dim, v_layer, v_scale);
    if constexpr (kIsCode<KV>)
      status = decode_attention_codes<W, KV>(
          qkv_stored, width, k_layer, v_layer, table, table_stride, rows_of, prefix_lens,
          qkv_stored + attn_dim, width, qkv_stored + attn_dim + kv_dim, width, attn_stored,
          attn_dim, rows, heads, kv_heads, head_dim, scale, 0, 0.0f, k_scale, v_scale);
    else
      status = decode_attention<W>(qkv_stored, width, k_layer, v_layer, table, table_stride,
                                   rows_of, prefix_lens, qkv_stored + attn_dim, width,
                                   qkv_stored + attn_dim + kv_dim, width, attn_stored, attn_dim,
                                   rows, heads, kv_heads, head_dim, scale);
    if constexpr (!kFloat) from_storage(attn_stored, attn, rows * attn_dim);
    if (status == 0)
      status = layer_mlp(layers[l], attn, residual, eps, normed, gate_up, hidden, rows,
                         hidden_size, attn_dim, intermediate);
  }
  if (status == 0) {
    for (int64_t m = 0; m < rows; ++m) {
      float* r = residual + m * hidden_size;
      const float* h = hidden + m * hidden_size;
      for (int64_t i = 0; i < hidden_size; ++i) r[i] += h[i];
      rms_norm(r, final_norm, eps, out + m * hidden_size, hidden_size);
    }
  }
  std::free(buffer);
  std::free(stored_buffer);
  return status;
}

}  // namespace

// The entry points, for float32 (_f32) and bfloat16 (_bf16) weights; activations
// (x, y, residual, hidden, cos, sin, qkv, attn, out) are float32 in both.
#define RADIXLM_SMALL_BATCH(SUFFIX, W)                                                        \
  /* y (rows, out) = x (rows, in) @ wt (out, in)^T + bias. Returns 0. */                     \
  extern "C" int radixlm_small_linear_##SUFFIX(const float* x, const W* wt, const W* bias,     \
                                                float* y, int64_t rows, int64_t in,            \
                                                int64_t out) {                                 \
    const Product<W> p{x, in, wt, bias, y, out, in, out};                                      \
    _Pragma("omp parallel") product_share(p, rows, omp_get_thread_num(),                       \
                                          omp_get_num_threads());                              \
    return 0;                                                                                  \
  }                                                                                            \
  /* One layer's attention input for rows tokens:                                              \
       residual += hidden (skipped when hidden is null: the first layer);                      \
       normed = rmsnorm(residual) * norm_weight;                                               \
       qkv = normed @ wt_qkv + bias_qkv, (rows, (H + 2 Hkv) * D) = [q | k | v];                \
       q and k heads: optional rmsnorm (q_norm / k_norm weights, both or neither),             \
       then RoPE (rotate-half form) with cos/sin (rows, D / 2).                                \
     Returns 0, or 1 when D is odd. */                                                         \
  extern "C" int radixlm_small_attention_in_##SUFFIX(                                          \
      float* residual, const float* hidden, const W* norm_weight, float eps, const W* wt_qkv,  \
      const W* bias_qkv, const W* q_norm, const W* k_norm, const float* cos, const float* sin, \
      float* normed, float* qkv, int64_t rows, int64_t hidden_size, int64_t heads,             \
      int64_t kv_heads, int64_t head_dim) {                                                    \
    if (head_dim % 2) return 1;                                                                \
    attention_in<W>(residual, hidden, norm_weight, eps, wt_qkv, bias_qkv, q_norm, k_norm, cos, \
                    sin, normed, qkv, rows, hidden_size, heads, kv_heads, head_dim);           \
    return 0;                                                                                  \
  }                                                                                            \
  /* One layer's attention output and MLP for rows tokens:                                     \
       o = attn (rows, attn_dim) @ wt_o + bias_o; residual += o;                               \
       x = rmsnorm(residual) * norm_weight;                                                    \
       gate_up = x @ wt_gate_up + bias_gate_up, (rows, 2 I) = [gate | up];                     \
       out = (silu(gate) * up) @ wt_down + bias_down, (rows, hidden_size).                     \
     scratch: (rows, hidden_size); gate_up: (rows, 2 I). Returns 0. */                         \
  extern "C" int radixlm_small_mlp_##SUFFIX(                                                   \
      const float* attn, const W* wt_o, const W* bias_o, float* residual,                      \
      const W* norm_weight, float eps, const W* wt_gate_up, const W* bias_gate_up,             \
      const W* wt_down, const W* bias_down, float* scratch, float* gate_up, float* out,        \
      int64_t rows, int64_t hidden_size, int64_t attn_dim, int64_t intermediate) {             \
    mlp<W>(attn, wt_o, bias_o, residual, norm_weight, eps, wt_gate_up, bias_gate_up, wt_down,  \
           bias_down, scratch, gate_up, out, rows, hidden_size, attn_dim, intermediate);       \
    return 0;                                                                                  \
  }                                                                                            \
  /* A whole decode step of `rows` decode rows (one new token each) through every             \
     layer, attention included, without returning to Python between layers: per               \
     layer, attention_in; the new K/V written to slot out_loc[m] of the layer's pool;         \
     decode attention over the row's cached slots and its new token                           \
     (decode_attention_cpu.cpp); mlp. Then out = rmsnorm(residual + hidden) *                  \
     final_norm: the model's final hidden states.                                              \
     layers: num_layers x 12 pointers (Layer); residual: (rows, hidden_size), the              \
     token embeddings, used as the residual stream; k_pool/v_pool: (num_layers,               \
     slots, Hkv, D) contiguous, of the weights' type; table/rows/prefix_lens as for           \
     decode attention. Returns 0, 1 for shapes the attention kernel does not take,            \
     2 when out of memory. */                                                                  \
  extern "C" int radixlm_small_decode_step_##SUFFIX(                                           \
      const Layer<W>* layers, int64_t num_layers, const W* final_norm, float eps,              \
      float* residual, const float* cos, const float* sin, W* k_pool, W* v_pool,               \
      int64_t pool_layer_stride, const int64_t* table, int64_t table_stride,                   \
      const int64_t* rows_of, const int64_t* prefix_lens, const int64_t* out_loc, float* out,  \
      int64_t rows, int64_t hidden_size, int64_t heads, int64_t kv_heads, int64_t head_dim,    \
      int64_t intermediate, float scale) {                                                     \
    return decode_step<W>(layers, num_layers, final_norm, eps, residual, cos, sin, k_pool,     \
                          v_pool, pool_layer_stride, table, table_stride, rows_of,             \
                          prefix_lens, out_loc, out, rows, hidden_size, heads, kv_heads,       \
                          head_dim, intermediate, scale);                                      \
  }

RADIXLM_SMALL_BATCH(f32, float)
RADIXLM_SMALL_BATCH(bf16, uint16_t)

extern "C" {

// Whether this build's products of bfloat16 weights run on AVX512-BF16 dot products
// of the inputs rounded to bfloat16 (row_tile_bf16): 1, else 0 (float32 inputs).
int radixlm_small_bf16_dot() { return kBf16Dot ? 1 : 0; }

// The eager model's elementwise steps as single passes, for passes of any size
// (torch runs RMSNorm as five ops on CPU, and RoPE and SwiGLU as two to four).

// residual (rows, n) += add (skipped when null); out = rmsnorm(residual) * weight.
// Returns 0.
int radixlm_add_rms_norm_f32(float* residual, const float* add, const float* weight, float eps,
                             float* out, int64_t rows, int64_t n) {
#pragma omp parallel
  add_and_norm_share(residual, add, weight, eps, out, rows, n, omp_get_thread_num(),
                     omp_get_num_threads());
  return 0;
}

// In place on rows of x (row_stride floats apart): the first `heads` heads of
// head_dim values, q heads then k heads, each optionally RMSNormed (q_norm for
// the first q_heads, k_norm after; both or neither) and then rotated with
// cos/sin (rows, head_dim / 2). Returns 0, or 1 when head_dim is odd.
int radixlm_rope_f32(float* x, int64_t row_stride, int64_t rows, int64_t q_heads, int64_t heads,
                     int64_t head_dim, const float* q_norm, const float* k_norm, float eps,
                     const float* cos, const float* sin) {
  if (head_dim % 2) return 1;
  const int64_t half = head_dim / 2;
#pragma omp parallel for schedule(static)
  for (int64_t item = 0; item < rows * heads; ++item) {
    const int64_t m = item / heads, h = item % heads;
    norm_and_rotate(x + m * row_stride + h * head_dim, h < q_heads ? q_norm : k_norm, eps,
                    cos + m * half, sin + m * half, head_dim);
  }
  return 0;
}

// gate_up (rows, 2 I) = [gate | up]: gate = silu(gate) * up, in place. Returns 0.
int radixlm_silu_mul_f32(float* gate_up, int64_t rows, int64_t intermediate) {
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < rows; ++m) {
    float* g = gate_up + m * 2 * intermediate;
    silu_mul(g, g + intermediate, g, intermediate);
  }
  return 0;
}


// The same steps over bfloat16 rows: each row (or head) is widened to float32 in a
// buffer of the thread's, computed as the float32 step computes it, and rounded once
// to bfloat16. The residual stream is kept in bfloat16: the sum is rounded before it
// is normed, as torch's in-place add rounds it. Norm weights are bfloat16 or float32
// (a model's float32 norms, Gemma's), cos/sin bfloat16 (the model's tables).

}  // extern "C"

namespace {

// A buffer of the calling thread's, at least n floats (one per slot: two steps of one
// row use slots 0 and 1).
float* scratch_row(int slot, int64_t n) {
  thread_local std::vector<float> rows[3];
  rows[slot].resize(n);
  return rows[slot].data();
}

template <typename W>
void add_rms_norm_bf16(uint16_t* residual, const uint16_t* add, const W* weight, float eps,
                       uint16_t* out, int64_t rows, int64_t n) {
#pragma omp parallel
  {
    float* x = scratch_row(0, n);
    float* a = scratch_row(1, n);
    const int thread = omp_get_thread_num(), threads = omp_get_num_threads();
    for (int64_t m = thread; m < rows; m += threads) {
      uint16_t* r = residual + m * n;
      from_storage(r, x, n);
      if (add) {
        from_storage(add + m * n, a, n);
        for (int64_t i = 0; i < n; ++i) x[i] += a[i];
        to_storage(x, r, n);
        from_storage(r, x, n);
      }
      rms_norm(x, weight, eps, x, n);
      to_storage(x, out + m * n, n);
    }
  }
}

template <typename W>
int rope_bf16(uint16_t* x, int64_t row_stride, int64_t rows, int64_t q_heads, int64_t heads,
              int64_t head_dim, const W* q_norm, const W* k_norm, float eps, const uint16_t* cos,
              const uint16_t* sin) {
  if (head_dim % 2) return 1;
  const int64_t half = head_dim / 2;
#pragma omp parallel
  {
    float* head = scratch_row(0, head_dim);
    float* c = scratch_row(1, half);
    float* s = scratch_row(2, half);
    int64_t widened = -1;  // the row whose cos/sin c and s hold
#pragma omp for schedule(static)
    for (int64_t item = 0; item < rows * heads; ++item) {
      const int64_t m = item / heads, h = item % heads;
      if (m != widened) {
        from_storage(cos + m * half, c, half);
        from_storage(sin + m * half, s, half);
        widened = m;
      }
      uint16_t* xh = x + m * row_stride + h * head_dim;
      from_storage(xh, head, head_dim);
      norm_and_rotate(head, h < q_heads ? q_norm : k_norm, eps, c, s, head_dim);
      to_storage(head, xh, head_dim);
    }
  }
  return 0;
}

}  // namespace

extern "C" {

// radixlm_add_rms_norm_f32 over bfloat16 rows; weight bfloat16 (_wbf16) or float32 (_wf32).
int radixlm_add_rms_norm_bf16_wbf16(uint16_t* residual, const uint16_t* add,
                                    const uint16_t* weight, float eps, uint16_t* out,
                                    int64_t rows, int64_t n) {
  add_rms_norm_bf16(residual, add, weight, eps, out, rows, n);
  return 0;
}

int radixlm_add_rms_norm_bf16_wf32(uint16_t* residual, const uint16_t* add, const float* weight,
                                   float eps, uint16_t* out, int64_t rows, int64_t n) {
  add_rms_norm_bf16(residual, add, weight, eps, out, rows, n);
  return 0;
}

// radixlm_rope_f32 over bfloat16 rows and cos/sin; the norms' weights bfloat16 or float32.
int radixlm_rope_bf16_wbf16(uint16_t* x, int64_t row_stride, int64_t rows, int64_t q_heads,
                            int64_t heads, int64_t head_dim, const uint16_t* q_norm,
                            const uint16_t* k_norm, float eps, const uint16_t* cos,
                            const uint16_t* sin) {
  return rope_bf16(x, row_stride, rows, q_heads, heads, head_dim, q_norm, k_norm, eps, cos, sin);
}

int radixlm_rope_bf16_wf32(uint16_t* x, int64_t row_stride, int64_t rows, int64_t q_heads,
                           int64_t heads, int64_t head_dim, const float* q_norm,
                           const float* k_norm, float eps, const uint16_t* cos,
                           const uint16_t* sin) {
  return rope_bf16(x, row_stride, rows, q_heads, heads, head_dim, q_norm, k_norm, eps, cos, sin);
}

// radixlm_silu_mul_f32 over bfloat16 rows.
int radixlm_silu_mul_bf16(uint16_t* gate_up, int64_t rows, int64_t intermediate) {
#pragma omp parallel
  {
    float* g = scratch_row(0, intermediate);
    float* u = scratch_row(1, intermediate);
#pragma omp for schedule(static)
    for (int64_t m = 0; m < rows; ++m) {
      uint16_t* row = gate_up + m * 2 * intermediate;
      from_storage(row, g, intermediate);
      from_storage(row + intermediate, u, intermediate);
      silu_mul(g, u, g, intermediate);
      to_storage(g, row, intermediate);
    }
  }
  return 0;
}

}  // extern "C"
