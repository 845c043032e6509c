// Decode attention over the KV pool, reading K/V slots in place (CPU).
//
// One decode row attends to the first prefix_lens[b] slots of its req_to_token
// row, then to its own new token (k_new/v_new), with grouped-query heads: query
// head h reads KV head h / G. The plain-torch gather + SDPA path copies every
// row's K/V out of the pool first (hundreds of MB per step for a large batch);
// this kernel streams them from the pool once.
//
// Work item = (span of up to 512 positions of a row, block of KV heads), dynamically
// scheduled over OpenMP threads (rows have very different lengths, and one long
// row alone must still keep every thread busy). Per item, two passes over its
// slots, each reading the block's K (then V) of a slot in one piece:
//   1. scores s[g][t] = scale * q_g . k_t for each query head g of the block,
//   2. p = exp(s - max), acc_g = sum_t p[g][t] v_t, l_g = sum_t p[g][t];
// then each row's spans are merged (flash-decoding's split-K):
//   out_g = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M), M = max_s m_s.
// Arithmetic is float32 whatever the storage type (float32 or bfloat16).
//
// Two options shape a call's scores (a model's layer; 0 turns either off):
//   window W > 0:  the row (its new token at position n) attends positions
//                  max(0, n + 1 - W) .. n only; its spans cover just those;
//   softcap c > 0: scores become c tanh(s / c) between the two passes.
// Without them the passes are exactly the plain ones.
//
// A quantized pool (int8 / fp8 codes and scales) is read by
// decode_attention_codes_cpu.cpp, which includes this file and builds apart.
//
// Built by radixlm.kernels.native with -O3 -fopenmp for AVX2 or AVX-512
// (vector_cpu.h: the vector type follows the target's width). The
// OpenMP runtime is torch's own: this library asks for libgomp.so.1, which
// torch has loaded already, so both share one thread pool.

// Guarded: small_batch_codes_cpu.cpp reaches it twice (through
// decode_attention_codes_cpu.cpp and small_batch_cpu.cpp).
#ifndef RADIXLM_DECODE_ATTENTION_CPU_CPP
#define RADIXLM_DECODE_ATTENTION_CPU_CPP

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "vector_cpu.h"

namespace {

constexpr int kMaxGroup = 8;              // query heads per KV head
constexpr int kMaxChunks = 256 / kLanes;  // head_dim / kLanes, so head_dim <= 256
constexpr int kMaxBlockHeads = 16;        // query heads per work item
constexpr int64_t kMaxSpan = 512;         // positions per work item

// Slots ahead whose K/V rows are requested from memory before they are read:
// the rows are scattered (one per slot), so the hardware prefetchers cannot
// guess them. Measured against fetching the first cache line only: 1.05-1.3x.
constexpr int64_t kAhead = 16;

inline void prefetch(const void* row, int64_t bytes) {
  const char* p = static_cast<const char*>(row);
  for (int64_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(p + offset);
}

// What one work item reads and writes.
template <typename T>
struct Item {
  const int64_t* slots;  // the row's n cached slots
  int64_t n;             // cached slots; position n is the new token
  int64_t begin, end;    // positions [begin, end) of this span
  const T* q;            // the block's query heads, (heads, D)
  const T* k;            // the pool at the block's first KV head
  const T* v;
  const T* k_new;        // the row's new token at the block's first KV head
  const T* v_new;
  float* scores;         // heads rows of round_up(end - begin, kLanes) floats of scratch
  float* partial;        // heads * (D + 2) floats: per head {max, sum, acc[D]}
};

// One work item: a span of positions of one row, for a block of KV heads that
// lie side by side in every slot (kv_heads of them, G query heads each). Reads
// each slot's block in one piece, K in pass 1 and V in pass 2, and writes the
// span's partial softmax per query head: max m, l = sum_t exp(s_t - m) and
// acc = sum_t exp(s_t - m) v_t. CHUNKS = D / kLanes, or 0 when only known at run
// time (chunks).
template <typename T, int CHUNKS>
void attend_span(const Item<T>& it, int kv_heads, int G, int chunks, int64_t kv_stride,
                 float scale, float softcap) {
  const int nc = CHUNKS > 0 ? CHUNKS : chunks;
  constexpr int kCap = CHUNKS > 0 ? CHUNKS : kMaxChunks;
  const int64_t D = int64_t(nc) * kLanes, width = it.end - it.begin;
  const int64_t stride = (width + kLanes - 1) / kLanes * kLanes;  // per head, whole vectors
  const int heads = kv_heads * G;
  const int64_t block_bytes = kv_heads * D * int64_t(sizeof(T));

  vf qv[kMaxBlockHeads][kCap];
  for (int g = 0; g < heads; ++g)
    for (int c = 0; c < nc; ++c) qv[g][c] = load(it.q + g * D + c * kLanes) * scale;

  // Pass 1: scores.
  float top[kMaxBlockHeads];
  for (int g = 0; g < heads; ++g) top[g] = -INFINITY;
  for (int64_t t = it.begin; t < it.begin + kAhead && t < it.n; ++t)
    prefetch(it.k + it.slots[t] * kv_stride, block_bytes);
  for (int64_t t = it.begin; t < it.end; ++t) {
    if (t + kAhead < it.n) prefetch(it.k + it.slots[t + kAhead] * kv_stride, block_bytes);
    const T* kp = t < it.n ? it.k + it.slots[t] * kv_stride : it.k_new;
    for (int h = 0; h < kv_heads; ++h) {
      vf kv[kCap];
      for (int c = 0; c < nc; ++c) kv[c] = load(kp + h * D + c * kLanes);
      for (int g = h * G; g < (h + 1) * G; ++g) {
        vf acc = qv[g][0] * kv[0];
        for (int c = 1; c < nc; ++c) acc += qv[g][c] * kv[c];
        const float s = hsum(acc);
        it.scores[g * stride + (t - it.begin)] = s;
        top[g] = s > top[g] ? s : top[g];
      }
    }
  }

  // Soft-capped scores (tanh is monotonic, but the maxima are taken again so that
  // no capped score exceeds its row's by an ulp of the approximation).
  if (softcap > 0.0f) {
    for (int g = 0; g < heads; ++g) {
      softcap_in_place(it.scores + g * stride, width, softcap);
      top[g] = max_of(it.scores + g * stride, width);
    }
  }

  // Softmax numerators in place, and their sums.
  for (int g = 0; g < heads; ++g) {
    it.partial[g * (D + 2)] = top[g];
    it.partial[g * (D + 2) + 1] = exp_in_place(it.scores + g * stride, width, top[g]);
  }

  // Pass 2: weighted sum of V.
  vf o[kMaxBlockHeads][kCap];
  for (int g = 0; g < heads; ++g)
    for (int c = 0; c < nc; ++c) o[g][c] = vf{};
  for (int64_t t = it.begin; t < it.begin + kAhead && t < it.n; ++t)
    prefetch(it.v + it.slots[t] * kv_stride, block_bytes);
  for (int64_t t = it.begin; t < it.end; ++t) {
    if (t + kAhead < it.n) prefetch(it.v + it.slots[t + kAhead] * kv_stride, block_bytes);
    const T* vp = t < it.n ? it.v + it.slots[t] * kv_stride : it.v_new;
    for (int h = 0; h < kv_heads; ++h) {
      vf vv[kCap];
      for (int c = 0; c < nc; ++c) vv[c] = load(vp + h * D + c * kLanes);
      for (int g = h * G; g < (h + 1) * G; ++g) {
        const vf p = splat(it.scores[g * stride + (t - it.begin)]);
        for (int c = 0; c < nc; ++c) o[g][c] += p * vv[c];
      }
    }
  }
  for (int g = 0; g < heads; ++g)
    for (int c = 0; c < nc; ++c) store(it.partial + g * (D + 2) + 2 + c * kLanes, o[g][c]);
}

// Combines a row's spans for one query head:
// out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M), M = max_s m_s.
template <typename T>
void merge_spans(const float* first, int64_t num_spans, int64_t span_stride, int64_t D, T* out) {
  float top = -INFINITY;
  for (int64_t s = 0; s < num_spans; ++s) top = std::fmax(top, first[s * span_stride]);
  float sum = 0.0f;
  for (int64_t s = 0; s < num_spans; ++s)
    sum += first[s * span_stride + 1] * std::exp(first[s * span_stride] - top);
  for (int64_t c = 0; c < D / kLanes; ++c) {
    vf acc = {};
    for (int64_t s = 0; s < num_spans; ++s) {
      const float* p = first + s * span_stride;
      acc += load(p + 2 + c * kLanes) * std::exp(p[0] - top);
    }
    store(out + c * kLanes, acc * (1.0f / sum));
  }
}

// KV heads per work item: the most that divide Hkv with at most kMaxBlockHeads
// query heads in all (all 3 of the default model's; 4 of Llama 3 8B's 8).
int block_kv_heads(int64_t Hkv, int G) {
  int best = 1;
  for (int h = 1; h <= Hkv && h * G <= kMaxBlockHeads; ++h)
    if (Hkv % h == 0) best = h;
  return best;
}

// Positions per span of a row of `positions` (its cached tokens and the new
// one): up to 8 spans of 128-512 positions, so that a few long rows (or one)
// keep every thread busy. A row's split depends on its own length only, so its
// result does not depend on the other rows of the batch or the thread count.
int64_t span_length(int64_t positions) {
  const int64_t len = (positions + 7) / 8;
  return len <= 128 ? 128 : len >= kMaxSpan ? kMaxSpan : (len + 15) / 16 * 16;
}

template <typename T>
int decode_attention(const T* q, int64_t q_stride, const T* k, const T* v, const int64_t* table,
                     int64_t table_stride, const int64_t* rows, const int64_t* prefix_lens,
                     const T* k_new, int64_t k_new_stride, const T* v_new,
                     int64_t v_new_stride, T* out, int64_t out_stride, int64_t B, int64_t H,
                     int64_t Hkv, int64_t D, float scale, int64_t window = 0,
                     float softcap = 0.0f) {
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
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < num_spans * blocks; ++item) {
      const int64_t s = item / blocks, block = item % blocks, b = span_row[s];
      const int64_t n = prefix_lens[b], first = first_position(b);
      const int64_t span = span_length(n + 1 - first);
      const int64_t begin = first + (s - first_span[b]) * span;
      const int64_t head = block * kv_heads;  // first KV head of the block
      const Item<T> it{table + rows[b] * table_stride,
                       n,
                       begin,
                       begin + span < n + 1 ? begin + span : n + 1,
                       q + b * q_stride + head * G * D,
                       k + head * D,
                       v + head * D,
                       k_new + b * k_new_stride + head * D,
                       v_new + b * v_new_stride + head * D,
                       scores,
                       partials + s * span_stride + head * G * (D + 2)};
      if (D == 64)
        attend_span<T, 64 / kLanes>(it, kv_heads, G, chunks, Hkv * D, scale, softcap);
      else if (D == 128)
        attend_span<T, 128 / kLanes>(it, kv_heads, G, chunks, Hkv * D, scale, softcap);
      else
        attend_span<T, 0>(it, kv_heads, G, chunks, Hkv * D, scale, softcap);
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

// The exported entry points (called through ctypes). window <= 0: no sliding
// window; softcap 0: no cap. Returns 0 on success, 1 for shapes the kernel does
// not take, 2 when its scratch memory could not be allocated.
#define RADIXLM_DECODE_ATTENTION(NAME, T)                                                   \
  extern "C" int NAME(const T* q, int64_t q_stride, const T* k, const T* v,                  \
                      const int64_t* table, int64_t table_stride, const int64_t* rows,       \
                      const int64_t* prefix_lens, const T* k_new, int64_t k_new_stride,     \
                      const T* v_new, int64_t v_new_stride, T* out, int64_t out_stride,      \
                      int64_t B, int64_t H, int64_t Hkv, int64_t D, float scale,            \
                      int64_t window, float softcap) {                                       \
    return decode_attention<T>(q, q_stride, k, v, table, table_stride, rows, prefix_lens,    \
                               k_new, k_new_stride, v_new, v_new_stride, out, out_stride, B, \
                               H, Hkv, D, scale, window, softcap);                           \
  }

RADIXLM_DECODE_ATTENTION(radixlm_decode_attention_f32, float)
RADIXLM_DECODE_ATTENTION(radixlm_decode_attention_bf16, uint16_t)

#endif  // RADIXLM_DECODE_ATTENTION_CPU_CPP
