// Decode attention over a quantized KV pool (CPU): int8 / fp8 e4m3 / fp8 e5m2 codes
// with a bfloat16 scale per slot and KV head (radixlm.runtime.mem_cache.kv_quant),
// read as stored. The plan of work items and the merge of spans are the float
// kernel's (decode_attention_cpu.cpp, included); a span runs attend_span_codes:
// codes widened in registers (vector_cpu.h), the k scale into each token's score
// and the v scale into its weight (once per token and head), V summed in register
// tiles (accumulate_tiles) and scores reduced four tokens at a time (hsum4), which a
// byte per value needs to be faster than two (benchmarks/README.md, "CPU paths and
// kernels"). The row's own new token is read from k_new/v_new as given (float).
//
// A library of its own (radixlm.kernels.cpu.decode_attention loads both): built in
// one translation unit with the float kernel, GCC compiled the unchanged float code
// differently (inlining and registers across the bigger unit): the bfloat16 kernel
// 4-5% slower on AVX-512, measured. Apart, the float library is byte for byte the
// code it was.

#include "decode_attention_cpu.cpp"

namespace {

// The same over a quantized pool: KV a code type (vector_cpu.h), with its scales.
template <typename T, typename KV>
struct CodeItem {
  const int64_t* slots;
  int64_t n;
  int64_t begin, end;
  const T* q;
  const KV* k;           // codes at the block's first KV head
  const KV* v;
  const T* k_new;
  const T* v_new;
  float* scores;
  float* partial;
  const uint16_t* k_scale;  // bfloat16 scales at the block's first KV head (slot stride Hkv)
  const uint16_t* v_scale;
  float* factors;        // 2 kMaxBlockHeads rows of kMaxSpan floats of scratch
};

// row[j] *= factors[j] for j < n, a vector at a time.
inline void scale_row(float* row, const float* factors, int64_t n) {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) store(row + j, load(row + j) * load(factors + j));
  for (; j < n; ++j) row[j] *= factors[j];
}

// Scores of one token's block of KV heads (kv rows at kp, head stride D):
// scores[g * stride] = factor[h] * q_g . k_h for each query head g of head h.
// factor: per head, what turns the dot product with the loaded vectors into the
// score (a quantized pool's scale times code_unit; 1 for a float row).
template <typename P, int kCap>
inline void score_token(const P* kp, const float* factor, const vf (*qv)[kCap], int kv_heads,
                        int G, int nc, int64_t D, float* scores, int64_t stride, float* top) {
  for (int h = 0; h < kv_heads; ++h) {
    vf kv[kCap];
    for (int c = 0; c < nc; ++c) kv[c] = load(kp + h * D + c * kLanes);
    for (int g = h * G; g < (h + 1) * G; ++g) {
      vf acc = qv[g][0] * kv[0];
      for (int c = 1; c < nc; ++c) acc += qv[g][c] * kv[c];
      const float s = hsum(acc) * factor[h];
      scores[g * stride] = s;
      top[g] = s > top[g] ? s : top[g];
    }
  }
}

// o_g += factor[h] p_g v_h for one token: the value rows at vp, weights p_g at
// weights[g * stride] (factor as score_token's).
template <typename P, int kCap>
inline void accumulate_token(const P* vp, const float* factor, vf (*o)[kCap], int kv_heads,
                             int G, int nc, int64_t D, const float* weights, int64_t stride) {
  for (int h = 0; h < kv_heads; ++h) {
    vf vv[kCap];
    for (int c = 0; c < nc; ++c) vv[c] = load(vp + h * D + c * kLanes);
    for (int g = h * G; g < (h + 1) * G; ++g) {
      const vf p = splat(weights[g * stride] * factor[h]);
      for (int c = 0; c < nc; ++c) o[g][c] += p * vv[c];
    }
  }
}

// Pass 2 over a quantized pool in register tiles: GN query heads of one KV head
// times kTileChunks vectors of D, accumulated in registers over the span's tokens
// (the plain pass keeps every head's accumulators, too many for the registers, in
// memory: a load and a store per product, which bounded it once the bytes read
// had halved). Each tile sweeps the span once, reading that part of its KV head's
// value row per token; a value is widened once per tile of heads, so the tiles
// are as narrow as lets one hold every query head of a KV head (G <= 6): 4
// vectors on AVX-512, 2 on AVX2 (4 there takes two tiles of heads for G = 3).
constexpr int kTileChunks = kLanes == 16 ? 4 : 2;
constexpr int kTileHeads = (kRegisters - kTileChunks - 1) / kTileChunks;  // 6 on both ISAs
// Tokens ahead whose values a tile requests: a token's step in a tile is a few
// products, so kAhead tokens are too few to hide a read from memory.
constexpr int64_t kTileAhead = 64;

// One tile: o_j += w_j[t] v_t[c0 ..] for j < GN over tokens [begin, cached_end)
// of the pool (w: the weights, already times each token's v scale and the code
// unit), then the new token when the span holds it; written to out_j (stride D + 2).
// The span's first tile requests each token's whole block of values (ahead_bytes)
// kTileAhead tokens before it reads them, the others nothing: the block is then
// in L2 (a span is at most 512 tokens) for the tiles after it.
template <typename T, typename KV, int GN>
void accumulate_tile(const CodeItem<T, KV>& it, int64_t offset, int64_t cached_end,
                     int64_t kv_stride, const float* weights, int64_t stride, float* out,
                     int64_t out_stride, int64_t ahead_bytes) {
  vf o[GN][kTileChunks] = {};
  const KV* v = it.v + offset;
  if (ahead_bytes > 0)
    for (int64_t t = it.begin; t < it.begin + kTileAhead && t < cached_end; ++t)
      prefetch(it.v + it.slots[t] * kv_stride, ahead_bytes);
  for (int64_t t = it.begin; t < cached_end; ++t) {
    if (ahead_bytes > 0 && t + kTileAhead < cached_end)
      prefetch(it.v + it.slots[t + kTileAhead] * kv_stride, ahead_bytes);
    const KV* vp = v + it.slots[t] * kv_stride;
    vf vv[kTileChunks];
#pragma GCC unroll 4
    for (int c = 0; c < kTileChunks; ++c) vv[c] = load(vp + c * kLanes);
#pragma GCC unroll 8
    for (int j = 0; j < GN; ++j) {
      const vf p = splat(weights[j * stride + (t - it.begin)]);
#pragma GCC unroll 4
      for (int c = 0; c < kTileChunks; ++c) o[j][c] += p * vv[c];
    }
  }
  if (it.end > it.n) {
    const T* vp = it.v_new + offset;
    vf vv[kTileChunks];
    for (int c = 0; c < kTileChunks; ++c) vv[c] = load(vp + c * kLanes);
    for (int j = 0; j < GN; ++j) {
      const vf p = splat(weights[j * stride + (it.n - it.begin)]);
      for (int c = 0; c < kTileChunks; ++c) o[j][c] += p * vv[c];
    }
  }
  for (int j = 0; j < GN; ++j)
    for (int c = 0; c < kTileChunks; ++c) store(out + j * out_stride + c * kLanes, o[j][c]);
}

// accumulate_tile<GN> for GN = gn (1 .. kTileHeads).
template <typename T, typename KV, int GN = kTileHeads>
void accumulate_tile_of(int gn, const CodeItem<T, KV>& it, int64_t offset, int64_t cached_end,
                        int64_t kv_stride, const float* weights, int64_t stride, float* out,
                        int64_t out_stride, int64_t ahead_bytes) {
  if constexpr (GN > 1) {
    if (gn < GN)
      return accumulate_tile_of<T, KV, GN - 1>(gn, it, offset, cached_end, kv_stride, weights,
                                               stride, out, out_stride, ahead_bytes);
  }
  accumulate_tile<T, KV, GN>(it, offset, cached_end, kv_stride, weights, stride, out,
                             out_stride, ahead_bytes);
}

// Pass 2 of attend_span_codes as tiles of (up to kTileHeads query heads of one KV
// head) x (kTileChunks vectors of D); it.scores holds the softmax numerators (their
// sums taken), which first take each cached token's v scale: once per token and
// query head, not once per tile.
template <typename T, typename KV>
void accumulate_tiles(const CodeItem<T, KV>& it, int kv_heads, int G, int nc, int64_t kv_stride,
                      int64_t stride) {
  const int64_t D = int64_t(nc) * kLanes;
  const int64_t cached_end = it.end < it.n ? it.end : it.n;
  const float* v_factors = it.factors + kMaxBlockHeads * kMaxSpan;
  for (int g = 0; g < kv_heads * G; ++g)
    scale_row(it.scores + g * stride, v_factors + g / G * kMaxSpan, cached_end - it.begin);
  for (int h = 0; h < kv_heads; ++h) {
    for (int g0 = h * G; g0 < (h + 1) * G; g0 += kTileHeads) {
      const int gn = std::min(kTileHeads, (h + 1) * G - g0);
      for (int c0 = 0; c0 < nc; c0 += kTileChunks) {
        const int64_t offset = h * D + c0 * kLanes;
        const bool first = h == 0 && g0 == 0 && c0 == 0;
        accumulate_tile_of<T, KV>(gn, it, offset, cached_end, kv_stride, it.scores + g0 * stride,
                                  stride,
                                  it.partial + g0 * (D + 2) + 2 + c0 * kLanes, D + 2,
                                  first ? kv_heads * D * int64_t(sizeof(KV)) : 0);
      }
    }
  }
}

// attend_span over a quantized pool (KV a code type): the same two passes, each
// cached token's codes widened in registers and never dequantized. The k scale
// multiplies the token's dot product (once per query head, not per value) and
// the v scale its softmax weight, so the inner loops read bytes, and the bytes a
// slot costs are the codes' plus a scale per head (the slot's scales share a
// cache line with its neighbours', which the allocator hands out in runs). The
// row's new token is read from k_new/v_new as given (float), as in attend_span.
template <typename T, typename KV, int CHUNKS>
void attend_span_codes(const CodeItem<T, KV>& it, int kv_heads, int G, int chunks,
                       int64_t kv_stride, int64_t scale_stride, float scale, float softcap) {
  const int nc = CHUNKS > 0 ? CHUNKS : chunks;
  constexpr int kCap = CHUNKS > 0 ? CHUNKS : kMaxChunks;
  constexpr float kUnit = code_unit<KV>();
  const int64_t D = int64_t(nc) * kLanes, width = it.end - it.begin;
  const int64_t stride = (width + kLanes - 1) / kLanes * kLanes;  // per head, whole vectors
  const int heads = kv_heads * G;
  const int64_t block_bytes = kv_heads * D * int64_t(sizeof(KV));
  const int64_t cached_end = it.end < it.n ? it.end : it.n;  // [begin, cached_end): the pool's
  float ones[kMaxBlockHeads], factor[kMaxBlockHeads];
  for (int h = 0; h < kv_heads; ++h) ones[h] = 1.0f;

  vf qv[kMaxBlockHeads][kCap];
  for (int g = 0; g < heads; ++g)
    for (int c = 0; c < nc; ++c) qv[g][c] = load(it.q + g * D + c * kLanes) * scale;

  // Each cached token's k and v scales (times the code unit), per KV head, as rows
  // over the span: read once here (a slot's scales lie side by side), then applied
  // a vector of tokens at a time to the scores (k) and the weights (v).
  const int64_t cached = cached_end - it.begin;
  float* const k_factors = it.factors;
  float* const v_factors = it.factors + kMaxBlockHeads * kMaxSpan;
  for (int64_t j = 0; j < cached; ++j) {
    if (j + kAhead < cached) {
      __builtin_prefetch(it.k_scale + it.slots[it.begin + j + kAhead] * scale_stride);
      __builtin_prefetch(it.v_scale + it.slots[it.begin + j + kAhead] * scale_stride);
    }
    const int64_t at = it.slots[it.begin + j] * scale_stride;
    for (int h = 0; h < kv_heads; ++h) {
      k_factors[h * kMaxSpan + j] = to_float(it.k_scale[at + h]) * kUnit;
      v_factors[h * kMaxSpan + j] = to_float(it.v_scale[at + h]) * kUnit;
    }
  }

  // Pass 1: dot products, then each cached token's times its k scale.
  float top[kMaxBlockHeads];
  for (int g = 0; g < heads; ++g) top[g] = -INFINITY;
  for (int64_t t = it.begin; t < it.begin + kAhead && t < it.n; ++t)
    prefetch(it.k + it.slots[t] * kv_stride, block_bytes);
  // Four tokens at a time: each query head's four dot-product vectors are kept
  // (stores, no dependency) and summed together (hsum4), and stored as one vector.
  // One hsum per token and head, a dependent chain of shuffles, scalar adds and a
  // scalar store, was most of this pass once the bytes read had halved.
  alignas(64) vf pending[kMaxBlockHeads][4];
  int64_t t = it.begin;
  for (; t + 4 <= cached_end; t += 4) {
    for (int j = 0; j < 4; ++j) {
      if (t + j + kAhead < it.n)
        prefetch(it.k + it.slots[t + j + kAhead] * kv_stride, block_bytes);
      const KV* kp = it.k + it.slots[t + j] * kv_stride;
      for (int h = 0; h < kv_heads; ++h) {
        vf kv[kCap];
        for (int c = 0; c < nc; ++c) kv[c] = load(kp + h * D + c * kLanes);
        for (int g = h * G; g < (h + 1) * G; ++g) {
          vf acc = qv[g][0] * kv[0];
          for (int c = 1; c < nc; ++c) acc += qv[g][c] * kv[c];
          pending[g][j] = acc;
        }
      }
    }
    for (int g = 0; g < heads; ++g) {
      const v4 sc = hsum4(pending[g][0], pending[g][1], pending[g][2], pending[g][3]);
      std::memcpy(it.scores + g * stride + (t - it.begin), &sc, sizeof sc);
    }
  }
  for (; t < cached_end; ++t) {
    if (t + kAhead < it.n) prefetch(it.k + it.slots[t + kAhead] * kv_stride, block_bytes);
    score_token<KV, kCap>(it.k + it.slots[t] * kv_stride, ones, qv, kv_heads, G, nc, D,
                          it.scores + (t - it.begin), stride, top);
  }
  for (int g = 0; g < heads; ++g) scale_row(it.scores + g * stride, k_factors + g / G * kMaxSpan, cached);
  if (it.end > it.n)  // the new token, as computed
    score_token<T, kCap>(it.k_new, ones, qv, kv_heads, G, nc, D, it.scores + (it.n - it.begin),
                         stride, top);
  for (int g = 0; g < heads; ++g) {
    if (softcap > 0.0f) softcap_in_place(it.scores + g * stride, width, softcap);
    top[g] = max_of(it.scores + g * stride, width);
  }
  for (int g = 0; g < heads; ++g) {
    it.partial[g * (D + 2)] = top[g];
    it.partial[g * (D + 2) + 1] = exp_in_place(it.scores + g * stride, width, top[g]);
  }

  // Pass 2: weighted sum of V, each weight times its token's v scale.
  if (nc % kTileChunks == 0) {
    accumulate_tiles<T, KV>(it, kv_heads, G, nc, kv_stride, stride);
    return;
  }
  vf o[kMaxBlockHeads][kCap];
  for (int g = 0; g < heads; ++g)
    for (int c = 0; c < nc; ++c) o[g][c] = vf{};
  for (int64_t t = it.begin; t < it.begin + kAhead && t < it.n; ++t) {
    prefetch(it.v + it.slots[t] * kv_stride, block_bytes);
    __builtin_prefetch(it.v_scale + it.slots[t] * scale_stride);
  }
  for (int64_t t = it.begin; t < cached_end; ++t) {
    if (t + kAhead < it.n) {
      prefetch(it.v + it.slots[t + kAhead] * kv_stride, block_bytes);
      __builtin_prefetch(it.v_scale + it.slots[t + kAhead] * scale_stride);
    }
    const int64_t slot = it.slots[t];
    for (int h = 0; h < kv_heads; ++h)
      factor[h] = to_float(it.v_scale[slot * scale_stride + h]) * kUnit;
    accumulate_token<KV, kCap>(it.v + slot * kv_stride, factor, o, kv_heads, G, nc, D,
                               it.scores + (t - it.begin), stride);
  }
  if (it.end > it.n)
    accumulate_token<T, kCap>(it.v_new, ones, o, kv_heads, G, nc, D,
                              it.scores + (it.n - it.begin), stride);
  for (int g = 0; g < heads; ++g)
    for (int c = 0; c < nc; ++c) store(it.partial + g * (D + 2) + 2 + c * kLanes, o[g][c]);
}

// decode_attention over a quantized pool: k/v hold codes of type KV (vector_cpu.h),
// k_scale/v_scale their (slots, Hkv) bfloat16 scales. The same plan of spans and
// merge; the spans run attend_span_codes.
template <typename T, typename KV>
int decode_attention_codes(const T* q, int64_t q_stride, const KV* k, const KV* v,
                           const int64_t* table, int64_t table_stride, const int64_t* rows,
                           const int64_t* prefix_lens, const T* k_new, int64_t k_new_stride,
                           const T* v_new, int64_t v_new_stride, T* out, int64_t out_stride,
                           int64_t B, int64_t H, int64_t Hkv, int64_t D, float scale,
                           int64_t window, float softcap, const uint16_t* k_scale,
                           const uint16_t* v_scale) {
  static_assert(kIsCode<KV>, "decode_attention_codes reads codes");
  if (k_scale == nullptr || v_scale == nullptr) return 1;
  if (Hkv <= 0 || H % Hkv != 0 || H / Hkv > kMaxGroup || D % kLanes != 0 ||
      D / kLanes > kMaxChunks || D <= 0)
    return 1;
  const int G = int(H / Hkv), chunks = int(D / kLanes);
  const int kv_heads = block_kv_heads(Hkv, G);
  const int64_t blocks = Hkv / kv_heads;

  // Spans first_span[b] .. first_span[b + 1] - 1 belong to row b; they cover its
  // positions first_position(b) .. n (n = prefix_lens[b]: the new token).
  const auto first_position = [&](int64_t b) -> int64_t {
    return window > 0 ? std::max<int64_t>(0, prefix_lens[b] + 1 - window) : 0;
  };
  int64_t* first_span = static_cast<int64_t*>(std::malloc((B + 1) * sizeof(int64_t)));
  if (first_span == nullptr) return 2;
  first_span[0] = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t positions = prefix_lens[b] + 1 - first_position(b);
    const int64_t len = span_length(positions);
    first_span[b + 1] = first_span[b] + (positions + len - 1) / len;
  }
  const int64_t num_spans = first_span[B];
  const int64_t span_stride = H * (D + 2);  // partial floats per span
  int64_t* span_row = static_cast<int64_t*>(std::malloc((num_spans + 1) * sizeof(int64_t)));
  float* partials = static_cast<float*>(std::malloc((num_spans * span_stride + 1) * sizeof(float)));
  if (span_row == nullptr || partials == nullptr) {
    std::free(first_span);
    std::free(span_row);
    std::free(partials);
    return 2;
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = first_span[b]; s < first_span[b + 1]; ++s) span_row[s] = b;

#pragma omp parallel
  {
    float scores[kMaxBlockHeads * kMaxSpan];
    float factors[2 * kMaxBlockHeads * kMaxSpan];  // attend_span_codes' scale rows
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < num_spans * blocks; ++item) {
      const int64_t s = item / blocks, block = item % blocks, b = span_row[s];
      const int64_t n = prefix_lens[b], first = first_position(b);
      const int64_t span = span_length(n + 1 - first);
      const int64_t begin = first + (s - first_span[b]) * span;
      const int64_t head = block * kv_heads;  // first KV head of the block
      const CodeItem<T, KV> it{table + rows[b] * table_stride,
                               n,
                               begin,
                               begin + span < n + 1 ? begin + span : n + 1,
                               q + b * q_stride + head * G * D,
                               k + head * D,
                               v + head * D,
                               k_new + b * k_new_stride + head * D,
                               v_new + b * v_new_stride + head * D,
                               scores,
                               partials + s * span_stride + head * G * (D + 2),
                               k_scale + head,
                               v_scale + head,
                               factors};
      if (D == 64)
        attend_span_codes<T, KV, 64 / kLanes>(it, kv_heads, G, chunks, Hkv * D, Hkv, scale,
                                              softcap);
      else if (D == 128)
        attend_span_codes<T, KV, 128 / kLanes>(it, kv_heads, G, chunks, Hkv * D, Hkv, scale,
                                               softcap);
      else
        attend_span_codes<T, KV, 0>(it, kv_heads, G, chunks, Hkv * D, Hkv, scale, softcap);
    }
#pragma omp for schedule(static)
    for (int64_t item = 0; item < B * H; ++item) {
      const int64_t b = item / H, h = item % H;
      merge_spans(partials + first_span[b] * span_stride + h * (D + 2),
                  first_span[b + 1] - first_span[b], span_stride, D,
                  out + b * out_stride + h * D);
    }
  }
  std::free(first_span);
  std::free(span_row);
  std::free(partials);
  return 0;
}

}  // namespace

// Over a quantized pool: k/v hold codes of type C, k_scale/v_scale (slots, Hkv)
// bfloat16 their scales (a value is code * scale); q, k_new, v_new and out are T.
// Otherwise as above.
#define RADIXLM_DECODE_ATTENTION_CODES(NAME, T, C)                                          \
  extern "C" int NAME(const T* q, int64_t q_stride, const C* k, const C* v,                  \
                      const int64_t* table, int64_t table_stride, const int64_t* rows,       \
                      const int64_t* prefix_lens, const T* k_new, int64_t k_new_stride,     \
                      const T* v_new, int64_t v_new_stride, T* out, int64_t out_stride,      \
                      int64_t B, int64_t H, int64_t Hkv, int64_t D, float scale,            \
                      int64_t window, float softcap, const uint16_t* k_scale,               \
                      const uint16_t* v_scale) {                                             \
    return decode_attention_codes<T, C>(q, q_stride, k, v, table, table_stride, rows,        \
                                        prefix_lens, k_new, k_new_stride, v_new,            \
                                        v_new_stride, out, out_stride, B, H, Hkv, D, scale, \
                                        window, softcap, k_scale, v_scale);                 \
  }

RADIXLM_DECODE_ATTENTION_CODES(radixlm_decode_attention_f32_i8, float, int8_t)
RADIXLM_DECODE_ATTENTION_CODES(radixlm_decode_attention_f32_e4m3, float, Fp8E4M3)
RADIXLM_DECODE_ATTENTION_CODES(radixlm_decode_attention_f32_e5m2, float, Fp8E5M2)
RADIXLM_DECODE_ATTENTION_CODES(radixlm_decode_attention_bf16_i8, uint16_t, int8_t)
RADIXLM_DECODE_ATTENTION_CODES(radixlm_decode_attention_bf16_e4m3, uint16_t, Fp8E4M3)
RADIXLM_DECODE_ATTENTION_CODES(radixlm_decode_attention_bf16_e5m2, uint16_t, Fp8E5M2)
