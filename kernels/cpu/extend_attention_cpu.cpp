// Prefill ("extend") attention over the KV pool on CPU: causal attention of a
// pass's new tokens to their request's cached prefix and to each other.
//
// Request b's new tokens sit at positions prefix_lens[b] .. prefix_lens[b] +
// extend_lens[b] - 1 and their K/V are in the pool already (the caller writes
// them first), so every key of request b is a slot of its req_to_token row:
// new token t sees slots[0 .. prefix_lens[b] + t]. Grouped-query heads: query
// head h reads KV head h / G.
//
// Two phases in one OpenMP region:
//   1. pack: each request's keys and values of each KV head are copied out of
//      the pool once, as float32: K transposed into panels of two vectors of
//      keys ((D, 2 L) each, L = kLanes, so one vector holds L keys' value of
//      one dimension) and V as (keys, D) rows;
//   2. attend: a tile is up to kTileRows query rows (a few consecutive tokens
//      times the G query heads of one KV head), which walks its keys in
//      blocks of 256 with an online softmax (flash attention):
//        s = q K^T  (R rows x 2 L keys per step: 2 R accumulators, each key
//                    panel read once for all R rows),
//        m' = max(m, max_j s), p = exp(s - m'), l = l e^(m - m') + sum_j p,
//        o = o e^(m - m') + p V  (6 rows x kPvChunks vectors per step).
//      The tiles fit the ISA's registers (vector_cpu.h):
//        AVX-512 (32 x 16 floats): R = 12, 24 score accumulators over 32 keys;
//                                  p V 6 rows x 64 dimensions (24 accumulators)
//        AVX2    (16 x  8 floats): R = 6, 12 score accumulators over 16 keys;
//                                  p V 6 rows x 16 dimensions (12 accumulators)
//      A work item is a strip of up to 4 consecutive tiles of one KV head that
//      walk the key blocks together, so a block comes from memory once per
//      strip and from cache for the rest of it (long prompts). Strips are
//      dealt out longest first (a late strip of a causal prompt sees the most
//      keys), so the threads finish together.
// Arithmetic is float32 whatever the storage type (float32 or bfloat16, or a
// quantized pool's int8/fp8 codes, multiplied by their scales as they are
// packed); each output row depends only on its own query, its keys and values, so it does
// not change with the batch around it or the thread count.
//
// Bfloat16 queries over a bfloat16 pool, where the build has AVX512-BF16
// (RADIXLM_BF16_DOT), take its dot products instead: each vdpbf16ps adds 32
// products where an FMA adds 16. The panels keep bfloat16 pairs: K as (D / 2,
// kPanel) pairs of a key's two consecutive dimensions, V as (key pairs, D) pairs of
// two consecutive keys' values of one dimension. The scores are the exact products of
// the stored query and keys summed in float32, then scaled; the weights p are rounded
// to bfloat16 before p V (torch's and oneDNN's bfloat16 attention round them alike),
// while the softmax's sums stay float32.
//
// Two options shape a call's scores (a model's layer; 0 turns either off):
//   window W > 0:  a token at position p attends keys p - W < k <= p only. Each
//                  row keeps [first, limit) of a block; a tile starts walking at
//                  the block of its rows' first key, and a request's panels
//                  before the block of its first token's first key are never
//                  packed (a long cached prefix costs nothing past the window);
//   softcap c > 0: a block's scores become c tanh(s / c) before the softmax.
// Without them a block is attended exactly as the plain kernel does.
//
// Measured on the 2-core dev VM against torch's flash attention for CPU
// (benchmarks/bench_extend_attention.py): see benchmarks/README.md.
//
// Built by radixlm.kernels.native; the vector type and helpers (load/store,
// exp_nonpositive, ...) come from vector_cpu.h.

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "vector_cpu.h"

namespace {

constexpr int kMaxChunks = 256 / kLanes;  // head_dim / kLanes, so head_dim <= 256
constexpr int kPanel = 2 * kLanes;        // keys per transposed K panel (two vectors)
constexpr int kMaxTileRows = 12;          // query rows a tile can hold (G <= 12)
// Query rows per tile where G allows: 2 R score accumulators, the panel's two
// vectors and a broadcast query value must fit the registers.
constexpr int kTileRows = std::min(kMaxTileRows, (kRegisters - 3) / 2);
constexpr int kPvRows = 6;                        // rows per p V step
constexpr int kPvChunks = kLanes == 16 ? 4 : 2;   // vectors of V per p V step
static_assert(kPvRows * kPvChunks + kPvChunks + 1 <= kRegisters, "p V fits the registers");
constexpr int64_t kKeyBlock = 256;  // keys per online-softmax step

// Whether queries T over a pool KV take the bfloat16 dot products (see the top).
template <typename T, typename KV>
constexpr bool kDot =
    RADIXLM_BF16_DOT && std::is_same_v<T, uint16_t> && std::is_same_v<KV, uint16_t>;
// What the panels hold: bfloat16 pairs for the dot products, else float32.
template <bool Dot>
using Packed = std::conditional_t<Dot, uint16_t, float>;
constexpr int kStripTiles = 4;      // tiles walking the key blocks together
static_assert(kKeyBlock % kPanel == 0, "a key block is whole panels");

// Keys [p * kPanel, (p + 1) * kPanel) of one request and KV head into panel p
// ((D, kPanel), zero past the last key), and their values into rows of v_out.
// A quantized pool (KV a code type, vector_cpu.h) is dequantized here, once per
// key: codes widened a vector at a time and multiplied by the key's scale
// (k_scale/v_scale at this KV head, slot stride scale_stride), so the attend phase
// is the float kernel's whatever the pool stores.
template <typename KV>
void pack_panel(const KV* k, const KV* v, const int64_t* slots, int64_t keys, int64_t kv_stride,
                int64_t D, int64_t p, float* kt_out, float* v_out,
                const uint16_t* k_scale = nullptr, const uint16_t* v_scale = nullptr,
                int64_t scale_stride = 0) {
  float* panel = kt_out + p * D * kPanel;
  for (int j = 0; j < kPanel; ++j) {
    const int64_t key = p * kPanel + j;
    if (key >= keys) {
      for (int64_t d = 0; d < D; ++d) panel[d * kPanel + j] = 0.0f;
      continue;
    }
    const KV* kr = k + slots[key] * kv_stride;
    const KV* vr = v + slots[key] * kv_stride;
    float* vo = v_out + key * D;
    if constexpr (kIsCode<KV>) {
      constexpr float kUnit = code_unit<KV>();
      const float ks = to_float(k_scale[slots[key] * scale_stride]) * kUnit;
      const float vs = to_float(v_scale[slots[key] * scale_stride]) * kUnit;
      alignas(64) float row[kLanes];
      for (int64_t d = 0; d < D; d += kLanes) {
        store(vo + d, load(vr + d) * vs);
        store(row, load(kr + d) * ks);
        for (int i = 0; i < kLanes; ++i) panel[(d + i) * kPanel + j] = row[i];
      }
    } else {
      for (int64_t d = 0; d < D; d += kLanes) store(vo + d, load(vr + d));
      for (int64_t d = 0; d < D; ++d) panel[d * kPanel + j] = to_float(kr[d]);
    }
  }
}

#if RADIXLM_BF16_DOT
// pack_panel for the dot products (bfloat16 queries over a bfloat16 pool): panel p
// as (D / 2, kPanel) pairs (a key's dimensions 2 i and 2 i + 1), and the values of its
// keys as kPanel / 2 blocks of (D, 2) (dimension d of two consecutive keys); keys
// past the last are zero, so are their pairs' second halves.
void pack_panel_bf16(const uint16_t* k, const uint16_t* v, const int64_t* slots, int64_t keys,
                     int64_t kv_stride, int64_t D, int64_t p, uint16_t* kt_out,
                     uint16_t* v_out) {
  uint16_t* panel = kt_out + p * D * kPanel;
  for (int j = 0; j < kPanel; ++j) {
    const int64_t key = p * kPanel + j;
    const uint16_t* kr = key < keys ? k + slots[key] * kv_stride : nullptr;
    for (int64_t d = 0; d < D; d += 2) {
      uint16_t* pair = panel + (d / 2 * kPanel + j) * 2;
      pair[0] = kr ? kr[d] : 0;
      pair[1] = kr ? kr[d + 1] : 0;
    }
  }
  // Two keys' rows of 16 values into 16 pairs: element 2 i of the result is a[i],
  // 2 i + 1 is b[i].
  const __m512i interleave = _mm512_set_epi16(
      31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
      23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);  // element 31 first
  const __m256i zero = _mm256_setzero_si256();
  for (int j = 0; j < kPanel; j += 2) {
    const int64_t key = p * kPanel + j;
    const uint16_t* a = key < keys ? v + slots[key] * kv_stride : nullptr;
    const uint16_t* b = key + 1 < keys ? v + slots[key + 1] * kv_stride : nullptr;
    uint16_t* out = v_out + key * D;  // the pair's block of (D, 2)
    for (int64_t d = 0; d < D; d += 16) {
      const __m256i x = a ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + d)) : zero;
      const __m256i y = b ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + d)) : zero;
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(x), y, 1);
      _mm512_storeu_si512(out + 2 * d, _mm512_permutexvar_epi16(interleave, both));
    }
  }
}
#endif

// Value rows requested ahead of their use. Software prefetch of the next K
// panel and of value rows 8 ahead: a 4,000-token prompt 95-103 ms against
// 112-118 ms without (alternating runs), a 1,000-token one 6.3-6.9 against 7.0-7.3.
constexpr int64_t kAheadRows = 8;

// o[r, :L C] += sum_j p[r, j] v[j, :L C] for rows [R0, R0 + RG) of a tile; p has
// rows of kKeyBlock, v and o rows of D. Each value row's L C columns are loaded
// once for all RG rows (RG x C accumulators).
template <int R0, int RG, int C>
void accumulate_group(const float* p, const float* v, int64_t width, int64_t D, float* o) {
  vf acc[RG][C] = {};
  for (int64_t j = 0; j < width; ++j) {
    for (int c = 0; c < C; ++c) __builtin_prefetch(v + (j + kAheadRows) * D + c * kLanes);
    vf vv[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) vv[c] = load(v + j * D + c * kLanes);
#pragma GCC unroll 6
    for (int r = 0; r < RG; ++r) {
      const float x = p[(R0 + r) * kKeyBlock + j];
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] += vv[c] * x;
    }
  }
  for (int r = 0; r < RG; ++r)
    for (int c = 0; c < C; ++c) {
      float* out = o + (R0 + r) * D + c * kLanes;
      store(out, load(out) + acc[r][c]);
    }
}

// accumulate_group over all R rows of a tile, kPvRows at a time.
template <int R, int C, int R0 = 0>
void accumulate_rows(const float* p, const float* v, int64_t width, int64_t D, float* o) {
  if constexpr (R0 < R) {
    constexpr int RG = R - R0 < kPvRows ? R - R0 : kPvRows;
    accumulate_group<R0, RG, C>(p, v, width, D, o);
    accumulate_rows<R, C, R0 + RG>(p, v, width, D, o);
  }
}

// accumulate_rows over C = `left` vectors of V (1 <= left <= kPvChunks).
template <int R, int C = kPvChunks>
void accumulate_chunks(int64_t left, const float* p, const float* v, int64_t width, int64_t D,
                       float* o) {
  if constexpr (C > 1) {
    if (left < C) return accumulate_chunks<R, C - 1>(left, p, v, width, D, o);
  }
  accumulate_rows<R, C>(p, v, width, D, o);
}

#if RADIXLM_BF16_DOT
// accumulate_group on the dot products: pb the weights as bfloat16 (rows of
// kKeyBlock), v the value pairs of pack_panel_bf16 ((D, 2) per key pair); each
// instruction adds two keys' products to a row's 16 dimensions.
template <int R0, int RG, int C>
void accumulate_group_bf16(const uint16_t* pb, const uint16_t* v, int64_t pairs, int64_t D,
                           float* o) {
  __m512 acc[RG][C];
  for (int r = 0; r < RG; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t i = 0; i < pairs; ++i) {
    const uint16_t* vp = v + i * 2 * D;
    __m512bh vv[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      __builtin_prefetch(vp + kAheadRows * D + c * 2 * kLanes);
      vv[c] = (__m512bh)_mm512_loadu_si512(vp + c * 2 * kLanes);
    }
#pragma GCC unroll 6
    for (int r = 0; r < RG; ++r) {
      int32_t w;
      std::memcpy(&w, pb + (R0 + r) * kKeyBlock + 2 * i, sizeof w);
      const __m512bh x = (__m512bh)_mm512_set1_epi32(w);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], vv[c], x);
    }
  }
  for (int r = 0; r < RG; ++r)
    for (int c = 0; c < C; ++c) {
      float* out = o + (R0 + r) * D + c * kLanes;
      store(out, load(out) + vf(acc[r][c]));
    }
}

template <int R, int C, int R0 = 0>
void accumulate_rows_bf16(const uint16_t* pb, const uint16_t* v, int64_t pairs, int64_t D,
                          float* o) {
  if constexpr (R0 < R) {
    constexpr int RG = R - R0 < kPvRows ? R - R0 : kPvRows;
    accumulate_group_bf16<R0, RG, C>(pb, v, pairs, D, o);
    accumulate_rows_bf16<R, C, R0 + RG>(pb, v, pairs, D, o);
  }
}

template <int R, int C = kPvChunks>
void accumulate_chunks_bf16(int64_t left, const uint16_t* pb, const uint16_t* v, int64_t pairs,
                            int64_t D, float* o) {
  if constexpr (C > 1) {
    if (left < C) return accumulate_chunks_bf16<R, C - 1>(left, pb, v, pairs, D, o);
  }
  accumulate_rows_bf16<R, C>(pb, v, pairs, D, o);
}
#endif

// One tile's rows across key blocks: their queries and the online softmax's
// running state.
struct TileState {
  alignas(64) float q[kMaxTileRows * kMaxChunks * kLanes];  // (R, D), pre-scaled
  // (R, D) as stored, for the dot products (their scores are scaled after)
  alignas(64) uint16_t qb[kMaxTileRows * kMaxChunks * kLanes];
  alignas(64) float o[kMaxTileRows * kMaxChunks * kLanes];  // (R, D), unnormalised
  float top[kMaxTileRows];    // running max of each row's scores
  float sum[kMaxTileRows];    // running sum of exp(score - top)
  int64_t limit[kMaxTileRows];  // keys row r sees end here (its causal limit, >= 1)
  int64_t first[kMaxTileRows];  // ... and start here (its window's first key; 0: none)
  int64_t keys;               // the most any row sees
  int64_t first_key;          // the least first[r]
  float softcap;              // 0: scores as they are
  float scale;                // the dot products' scores' scale (q is pre-scaled else)
  int rows;
};

// Scores of keys [j0, j0 + width) for R rows into s (rows of kKeyBlock): R rows x
// kPanel keys per panel, each panel read once for all R rows.
template <int R>
void block_scores(const TileState& st, const float* kt, int64_t D, int64_t j0, int64_t width,
                  float* s) {
  const int64_t panels = (width + kPanel - 1) / kPanel;
  const float* q = st.q;
  for (int64_t p = 0; p < panels; ++p) {
    const float* kp = kt + (j0 / kPanel + p) * D * kPanel;
    vf acc[R][2] = {};
    for (int64_t d = 0; d < D; ++d) {
      const vf k0 = load(kp + d * kPanel), k1 = load(kp + d * kPanel + kLanes);
      __builtin_prefetch(kp + (D + d) * kPanel);  // the next panel, 4 D kPanel bytes ahead
      __builtin_prefetch(kp + (D + d) * kPanel + kLanes);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const float x = q[r * D + d];
        acc[r][0] += k0 * x;
        acc[r][1] += k1 * x;
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      store(s + r * kKeyBlock + p * kPanel, acc[r][0]);
      store(s + r * kKeyBlock + p * kPanel + kLanes, acc[r][1]);
    }
  }
}

#if RADIXLM_BF16_DOT
// block_scores on the dot products: the panels of pack_panel_bf16, the queries as
// stored (st.qb), each instruction two dimensions of 16 keys; then scaled.
template <int R>
void block_scores(const TileState& st, const uint16_t* kt, int64_t D, int64_t j0,
                  int64_t width, float* s) {
  const int64_t panels = (width + kPanel - 1) / kPanel;
  const vf scale = splat(st.scale);
  for (int64_t p = 0; p < panels; ++p) {
    const uint16_t* kp = kt + (j0 / kPanel + p) * D * kPanel;
    __m512 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 2) {
      const uint16_t* kd = kp + d * kPanel;  // (kPanel, 2): this pair of dimensions
      const __m512bh k0 = (__m512bh)_mm512_loadu_si512(kd);
      const __m512bh k1 = (__m512bh)_mm512_loadu_si512(kd + 2 * kLanes);
      __builtin_prefetch(kd + D * kPanel);  // the next panel's, D kPanel values ahead
      __builtin_prefetch(kd + D * kPanel + 2 * kLanes);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        int32_t pair;
        std::memcpy(&pair, st.qb + r * D + d, sizeof pair);
        const __m512bh x = (__m512bh)_mm512_set1_epi32(pair);
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], k0, x);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], k1, x);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      store(s + r * kKeyBlock + p * kPanel, vf(acc[r][0]) * scale);
      store(s + r * kKeyBlock + p * kPanel + kLanes, vf(acc[r][1]) * scale);
    }
  }
}
#endif

// o += p V over keys [j0, j0 + width): s the weights (rows of kKeyBlock), in
// blocks of up to kPvRows rows x kPvChunks vectors.
template <int R>
void block_values(float* s, const float* v, int64_t D, int64_t j0, int64_t width, float* o) {
  const int64_t chunks = D / kLanes;
  const float* vb = v + j0 * D;
  for (int64_t c = 0; c < chunks; c += kPvChunks)
    accumulate_chunks<R>(chunks - c, s, vb + c * kLanes, width, D, o + c * kLanes);
}

#if RADIXLM_BF16_DOT
// block_values on the dot products: the weights rounded to bfloat16 (zero past
// width, so an odd width's last pair adds nothing), then two keys an instruction over
// the value pairs of pack_panel_bf16.
template <int R>
void block_values(float* s, const uint16_t* v, int64_t D, int64_t j0, int64_t width, float* o) {
  alignas(64) uint16_t pb[R * kKeyBlock];
  const int64_t pairs = (width + 1) / 2;
  const int64_t whole = (2 * pairs + kLanes - 1) / kLanes * kLanes;  // <= kKeyBlock
  for (int r = 0; r < R; ++r) {
    float* sr = s + r * kKeyBlock;
    std::fill(sr + width, sr + whole, 0.0f);
    for (int64_t j = 0; j < whole; j += kLanes)
      _mm256_store_si256(reinterpret_cast<__m256i*>(pb + r * kKeyBlock + j),
                         (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(sr + j)));
  }
  const int64_t chunks = D / kLanes;
  const uint16_t* vb = v + j0 * D;
  for (int64_t c = 0; c < chunks; c += kPvChunks)
    accumulate_chunks_bf16<R>(chunks - c, pb, vb + 2 * c * kLanes, pairs, D, o + c * kLanes);
}
#endif

// Keys [j0, j0 + 256) (clipped to st.keys) of one tile of R rows: scores, the
// online-softmax update, and o += p V. kt/v: the request's packed K panels and
// V rows for this KV head (float32, or the dot products' bfloat16 pairs).
template <int R, typename P>
void attend_block(TileState& st, const P* kt, const P* v, int64_t D, int64_t j0) {
  alignas(64) float s[R * kKeyBlock];
  const int64_t chunks = D / kLanes;
  const int64_t width = std::min(kKeyBlock, st.keys - j0);
  float* o = st.o;
  block_scores<R>(st, kt, D, j0, width, s);
  if (st.softcap > 0.0f)
    for (int r = 0; r < R; ++r) softcap_in_place(s + r * kKeyBlock, width, st.softcap);

  // Online softmax: row r keeps keys [first[r], limit[r]) of the block's
  // [j0, j0 + width): its [begin, valid), begin 0 without a window. A windowed
  // row's scores before begin in begin's vector become -inf, so that its max and
  // exponentials run over whole vectors from `from`, begin rounded down. The
  // rows' maxima first, then all R rescale factors in vector exps, then each
  // row's exponentials in place (zero outside what it keeps).
  constexpr int kRounded = (R + kLanes - 1) / kLanes * kLanes;
  alignas(64) float new_top[kRounded] = {}, rescale[kRounded] = {};
  int64_t valid[R], begin[R], from[R];
  for (int r = 0; r < R; ++r) {
    float* sr = s + r * kKeyBlock;
    valid[r] = std::min(width, st.limit[r] - j0);  // <= 0: the block is this row's future
    begin[r] = std::clamp<int64_t>(st.first[r] - j0, 0, width);  // >= valid: the row's past
    from[r] = begin[r] / kLanes * kLanes;
    const bool any = valid[r] > begin[r];
    if (any) std::fill(sr + from[r], sr + begin[r], -INFINITY);
    new_top[r] = any ? std::max(st.top[r], max_of(sr + from[r], valid[r] - from[r])) : st.top[r];
    // 0 where the max stays: a windowed row meets blocks before its first key,
    // where -inf - -inf would be NaN.
    rescale[r] = new_top[r] == st.top[r] ? 0.0f : st.top[r] - new_top[r];
  }
  // exp(-inf - top) on a row's first block: ~1e-38 times its zero sum and output.
  exp_array(rescale, rescale, R);
  for (int r = 0; r < R; ++r) {
    float* sr = s + r * kKeyBlock;
    const int64_t kept = std::max<int64_t>(valid[r], 0);
    float block_sum = 0.0f;
    if (kept > begin[r]) {
      // The -inf scores weigh exp(-87) ~ 1e-38 in the sum (beside the max's 1:
      // nothing), then 0 in p V.
      block_sum = exp_in_place(sr + from[r], kept - from[r], new_top[r]);
      std::fill(sr, sr + begin[r], 0.0f);
    } else {
      std::fill(sr, sr + width, 0.0f);  // nothing kept: every weight 0
    }
    for (int64_t j = (kept + kLanes - 1) / kLanes * kLanes; j < width; ++j) sr[j] = 0.0f;
    st.sum[r] = st.sum[r] * rescale[r] + block_sum;
    st.top[r] = new_top[r];
    if (rescale[r] != 1.0f)
      for (int64_t c = 0; c < chunks; ++c)
        store(o + r * D + c * kLanes, load(o + r * D + c * kLanes) * rescale[r]);
  }

  block_values<R>(s, v, D, j0, width, o);
}

template <typename P>
using BlockFn = void (*)(TileState&, const P*, const P*, int64_t, int64_t);

template <typename P, int... Rs>
constexpr std::array<BlockFn<P>, sizeof...(Rs)> block_functions(
    std::integer_sequence<int, Rs...>) {
  return {attend_block<Rs + 1, P>...};
}

// attend_block<R> for R = 1 .. kMaxTileRows, by R - 1, over panels of P.
template <typename P>
constexpr auto kBlockFunctions =
    block_functions<P>(std::make_integer_sequence<int, kMaxTileRows>{});

// A strip: request b's new tokens [t0, t0 + tokens) for KV head h, attended as
// up to kStripTiles tiles that walk the key blocks together (each block of K and
// V is read from memory once for all of them, then from cache); cost = the keys
// from its first token's first key to its last token.
struct Strip {
  int64_t b, h, t0, tokens, cost;
};

// The first key position the token at `position` attends: 0, or its window's.
inline int64_t first_key(int64_t position, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, position + 1 - window) : 0;
}

// Where each request's packs lie and what to attend. Request b's packs hold its
// keys from base[b] on (0, or the key block of its first token's first key when
// a window hides the keys before it), panels[b] K panels per KV head; its head
// h's panels start at panel first_panel[b] + h * panels[b]; V row j of that
// head is row kPanel * (that panel) + j of the V pack, key base[b] + j.
struct Plan {
  std::vector<int64_t> first_panel;  // (B + 1,)
  std::vector<int64_t> panels;       // (B,)
  std::vector<int64_t> base;         // (B,) first key packed, a multiple of kKeyBlock
  std::vector<int64_t> panel_owner;  // request of each panel
  std::vector<Strip> strips;         // longest first
  int64_t per_tile;                  // tokens per tile

  Plan(const int64_t* prefix_lens, const int64_t* extend_lens, int64_t B, int64_t Hkv,
       int64_t G, int64_t window)
      : first_panel(B + 1), panels(B), base(B), per_tile(std::max<int64_t>(1, kTileRows / G)) {
    const int64_t per_strip = per_tile * kStripTiles;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t prefix = prefix_lens[b];
      base[b] = first_key(prefix, window) / kKeyBlock * kKeyBlock;
      panels[b] = (prefix + extend_lens[b] - base[b] + kPanel - 1) / kPanel;
      first_panel[b + 1] = first_panel[b] + panels[b] * Hkv;
      panel_owner.insert(panel_owner.end(), panels[b] * Hkv, b);
      for (int64_t t0 = 0; t0 < extend_lens[b]; t0 += per_strip) {
        const int64_t tokens = std::min(per_strip, extend_lens[b] - t0);
        const int64_t cost = prefix + t0 + tokens - first_key(prefix + t0, window);
        for (int64_t h = 0; h < Hkv; ++h) strips.push_back(Strip{b, h, t0, tokens, cost});
      }
    }
    std::stable_sort(strips.begin(), strips.end(),
                     [](const Strip& x, const Strip& y) { return x.cost > y.cost; });
  }

  int64_t head_panel(int64_t b, int64_t h) const { return first_panel[b] + h * panels[b]; }
};

// KV: the pool's storage, T or a code type with its scales (k_scale/v_scale,
// (slots, Hkv) bfloat16; null for a float pool).
template <typename T, typename KV = T>
struct ExtendArgs {
  const T* q;
  int64_t q_stride;
  const KV* k;
  const KV* v;
  const int64_t* table;
  int64_t table_stride;
  const int64_t* rows;
  const int64_t* prefix_lens;
  const int64_t* extend_lens;
  const int64_t* starts;
  T* out;
  int64_t out_stride;
  int64_t B, H, Hkv, D;
  float scale;
  int64_t window;  // <= 0: none
  float softcap;   // 0: none
  const uint16_t* k_scale;
  const uint16_t* v_scale;
};

// One strip: its tiles' queries (scaled, float32) in, the key blocks walked
// with every tile that sees them, the normalised rows out. st: kStripTiles
// states of this thread's. Keys are counted from the request's base (its first
// packed key), so key j of a tile is position base + j.
// P: what the panels hold (Packed), which decides the queries' form: as stored for
// the dot products, pre-scaled float32 else.
template <typename T, typename KV, typename P>
void run_strip(const ExtendArgs<T, KV>& a, const Plan& plan, const Strip& strip, const P* kt,
               const P* vs, TileState* st) {
  const int64_t G = a.H / a.Hkv, D = a.D, prefix = a.prefix_lens[strip.b];
  const int64_t base = plan.base[strip.b];
  const int64_t first_token = a.starts[strip.b] + strip.t0;
  const int tiles = int((strip.tokens + plan.per_tile - 1) / plan.per_tile);
  int64_t keys = 0, from = INT64_MAX;
  for (int i = 0; i < tiles; ++i) {
    TileState& tile = st[i];
    const int64_t t0 = i * plan.per_tile;
    const int64_t tokens = std::min(plan.per_tile, strip.tokens - t0);
    tile.rows = int(tokens * G);
    tile.keys = prefix + strip.t0 + t0 + tokens - base;
    tile.first_key = first_key(prefix + strip.t0 + t0, a.window) - base;  // its first token's
    tile.softcap = a.softcap;
    tile.scale = a.scale;
    keys = std::max(keys, tile.keys);
    from = std::min(from, tile.first_key);
    for (int64_t t = 0; t < tokens; ++t) {
      const T* qr = a.q + (first_token + t0 + t) * a.q_stride + strip.h * G * D;
      const int64_t position = prefix + strip.t0 + t0 + t;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t r = t * G + g;
        if constexpr (std::is_same_v<P, uint16_t>)
          std::memcpy(tile.qb + r * D, qr + g * D, sizeof(uint16_t) * D);
        else
          for (int64_t d = 0; d < D; d += kLanes)
            store(tile.q + r * D + d, load(qr + g * D + d) * a.scale);
        tile.limit[r] = position + 1 - base;
        tile.first[r] = first_key(position, a.window) - base;
        tile.top[r] = -INFINITY;
        tile.sum[r] = 0.0f;
      }
    }
    std::memset(tile.o, 0, sizeof(float) * tile.rows * D);
  }
  const int64_t first = plan.head_panel(strip.b, strip.h);
  const P* head_kt = kt + first * D * kPanel;
  const P* head_v = vs + first * kPanel * D;
  for (int64_t j0 = from / kKeyBlock * kKeyBlock; j0 < keys; j0 += kKeyBlock)
    for (int i = 0; i < tiles; ++i)
      if (j0 < st[i].keys && j0 + kKeyBlock > st[i].first_key)
        kBlockFunctions<P>[st[i].rows - 1](st[i], head_kt, head_v, D, j0);
  for (int i = 0; i < tiles; ++i) {
    const TileState& tile = st[i];
    for (int r = 0; r < tile.rows; ++r) {
      const int64_t t = i * plan.per_tile + r / G, g = r % G;
      T* out = a.out + (first_token + t) * a.out_stride + (strip.h * G + g) * D;
      const float inv = 1.0f / tile.sum[r];
      for (int64_t d = 0; d < D; d += kLanes) store(out + d, load(tile.o + r * D + d) * inv);
    }
  }
}

template <typename T, typename KV>
int extend_attention(const ExtendArgs<T, KV>& a) {
  const int64_t H = a.H, Hkv = a.Hkv, D = a.D;
  if (Hkv <= 0 || H % Hkv != 0 || H / Hkv > kMaxTileRows || D % kLanes != 0 ||
      D / kLanes > kMaxChunks || D <= 0 || a.B < 0)
    return 1;
  if constexpr (kIsCode<KV>) {
    if (a.k_scale == nullptr || a.v_scale == nullptr) return 1;
  }
  const Plan plan(a.prefix_lens, a.extend_lens, a.B, Hkv, H / Hkv, a.window);
  const int64_t total_panels = plan.first_panel[a.B];
  // Uninitialised: every panel is written whole by pack_panel, every state by run_strip.
  using P = Packed<kDot<T, KV>>;
  const std::unique_ptr<P[]> kt(new P[total_panels * D * kPanel]);
  const std::unique_ptr<P[]> vs(new P[total_panels * kPanel * D]);
  const std::unique_ptr<TileState[]> states(new TileState[omp_get_max_threads() * kStripTiles]);
  const int64_t num_strips = int64_t(plan.strips.size());
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < total_panels; ++i) {
      const int64_t b = plan.panel_owner[i];
      const int64_t h = (i - plan.first_panel[b]) / plan.panels[b];
      const int64_t first = plan.head_panel(b, h);
      const int64_t base = plan.base[b];
      const int64_t* slots = a.table + a.rows[b] * a.table_stride + base;
      const int64_t keys = a.prefix_lens[b] + a.extend_lens[b] - base;
      P* kt_head = kt.get() + first * D * kPanel;
      P* vs_head = vs.get() + first * kPanel * D;
      if constexpr (kDot<T, KV>) {
#if RADIXLM_BF16_DOT
        pack_panel_bf16(a.k + h * D, a.v + h * D, slots, keys, Hkv * D, D, i - first, kt_head,
                        vs_head);
#endif
      } else if constexpr (kIsCode<KV>)
        pack_panel(a.k + h * D, a.v + h * D, slots, keys, Hkv * D, D, i - first, kt_head, vs_head,
                   a.k_scale + h, a.v_scale + h, Hkv);
      else
        pack_panel(a.k + h * D, a.v + h * D, slots, keys, Hkv * D, D, i - first, kt_head,
                   vs_head);
    }
    TileState* st = states.get() + omp_get_thread_num() * kStripTiles;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < num_strips; ++i)
      run_strip(a, plan, plan.strips[i], kt.get(), vs.get(), st);
  }
  return 0;
}

}  // namespace

// The exported entry points (called through ctypes). window <= 0: no sliding
// window; softcap 0: no cap. Returns 0 on success, 1 for shapes the kernel does
// not take, 2 when its scratch memory could not be allocated.
#define RADIXLM_EXTEND_ATTENTION(NAME, T)                                                      \
  extern "C" int NAME(const T* q, int64_t q_stride, const T* k, const T* v,                    \
                      const int64_t* table, int64_t table_stride, const int64_t* rows,         \
                      const int64_t* prefix_lens, const int64_t* extend_lens,                  \
                      const int64_t* starts, T* out, int64_t out_stride, int64_t B, int64_t H, \
                      int64_t Hkv, int64_t D, float scale, int64_t window, float softcap) {    \
    try {                                                                                      \
      return extend_attention<T, T>({q, q_stride, k, v, table, table_stride, rows,             \
                                     prefix_lens, extend_lens, starts, out, out_stride, B, H,  \
                                     Hkv, D, scale, window, softcap, nullptr, nullptr});       \
    } catch (const std::bad_alloc&) {                                                          \
      return 2;                                                                                \
    }                                                                                          \
  }

RADIXLM_EXTEND_ATTENTION(radixlm_extend_attention_f32, float)
RADIXLM_EXTEND_ATTENTION(radixlm_extend_attention_bf16, uint16_t)

// Whether this build's bfloat16 calls over a bfloat16 pool take the AVX512-BF16 dot
// products (the weights rounded to bfloat16 before p V): 1, else 0.
extern "C" int radixlm_extend_bf16_dot() { return kDot<uint16_t, uint16_t> ? 1 : 0; }

// Over a quantized pool: k/v hold codes of type C, k_scale/v_scale (slots, Hkv)
// bfloat16 their scales (a value is code * scale); q and out are T. Otherwise as above.
#define RADIXLM_EXTEND_ATTENTION_CODES(NAME, T, C)                                             \
  extern "C" int NAME(const T* q, int64_t q_stride, const C* k, const C* v,                    \
                      const int64_t* table, int64_t table_stride, const int64_t* rows,         \
                      const int64_t* prefix_lens, const int64_t* extend_lens,                  \
                      const int64_t* starts, T* out, int64_t out_stride, int64_t B, int64_t H, \
                      int64_t Hkv, int64_t D, float scale, int64_t window, float softcap,      \
                      const uint16_t* k_scale, const uint16_t* v_scale) {                      \
    try {                                                                                      \
      return extend_attention<T, C>({q, q_stride, k, v, table, table_stride, rows,             \
                                     prefix_lens, extend_lens, starts, out, out_stride, B, H,  \
                                     Hkv, D, scale, window, softcap, k_scale, v_scale});       \
    } catch (const std::bad_alloc&) {                                                          \
      return 2;                                                                                \
    }                                                                                          \
  }

RADIXLM_EXTEND_ATTENTION_CODES(radixlm_extend_attention_f32_i8, float, int8_t)
RADIXLM_EXTEND_ATTENTION_CODES(radixlm_extend_attention_f32_e4m3, float, Fp8E4M3)
RADIXLM_EXTEND_ATTENTION_CODES(radixlm_extend_attention_f32_e5m2, float, Fp8E5M2)
RADIXLM_EXTEND_ATTENTION_CODES(radixlm_extend_attention_bf16_i8, uint16_t, int8_t)
RADIXLM_EXTEND_ATTENTION_CODES(radixlm_extend_attention_bf16_e4m3, uint16_t, Fp8E4M3)
RADIXLM_EXTEND_ATTENTION_CODES(radixlm_extend_attention_bf16_e5m2, uint16_t, Fp8E5M2)
