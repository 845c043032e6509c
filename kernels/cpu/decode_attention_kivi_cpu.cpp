// Decode attention over a KIVI KV pool (CPU): 4- or 2-bit codes read in place
// (kivi_cpu.h has the layout), unpacked in registers and never dequantized to
// memory. The plan of work items (a span of a row's positions, a block of KV
// heads) and the merge of spans are the float kernel's (decode_attention_cpu.cpp,
// included); a span runs attend_span_kivi.
//
// Unlike the other decode kernels, the row's new token is in the pool already
// (KiviWrites stores a pass's tokens before attention: in its window, or in codes
// when it completes a group), so a row attends positions 0 .. n - 1 of what is
// stored, n = seq_lens[b], and there is no k_new/v_new.
//
// Keys: a key group's scales and minimums are per channel, shared by its G
// positions, so they enter the query once per group rather than each code:
//   q . (code * s + m) = (q * s) . code + q . m
// so a coded key costs a dot product of the codes with q * s (a vector of D, made
// once per group and query head) plus a scalar; four tokens' sums are reduced
// together (hsum4). Values: scales and minimums are per token and channel group, so
// a token's value vectors are dequantized in registers (one multiply-add a vector)
// once per KV head, then weighted for each of its G query heads. A vector of codes
// costs five instructions to unpack (kivi_cpu.h) where a bfloat16 one costs two to
// widen: timed against the other pools by benchmarks/bench_decode_attention.py
// --kv-cache-dtype.
//
// A library of its own, like decode_attention_codes_cpu.cpp (see there): the
// float kernels compile as they did.

#include "decode_attention_cpu.cpp"
#include "kivi_cpu.h"

namespace {

constexpr int kMaxValueGroups = 256 / 16;  // D / Vg: head dim <= 256, Vg a multiple of 16

// What one work item reads and writes.
template <typename T>
struct KiviItem {
  const int64_t* slots;  // the row's slots by position
  int64_t row;           // its req_to_token row: its window
  int64_t n;             // positions stored (the new token's included)
  int64_t begin, end;    // positions [begin, end) of this span
  const T* q;            // the block's query heads, (heads, D)
  int64_t head;          // the block's first KV head
  float* scores;         // heads rows of round_up(end - begin, kLanes) floats of scratch
  float* partial;        // heads * (D + 2) floats: per head {max, sum, acc[D]}
};

// One work item over a KIVI pool (see the file): pass 1 scores, coded positions
// group by group, then the window's; softmax numerators; pass 2 the weighted sum
// of values. CHUNKS = D / kLanes, or 0 when known at run time only (chunks).
template <typename T, int BITS, int CHUNKS>
void attend_span_kivi(const KiviLayer<T>& layer, const KiviItem<T>& it, int kv_heads, int G,
                      int chunks, float scale, float softcap) {
  const int nc = CHUNKS > 0 ? CHUNKS : chunks;
  constexpr int kCap = CHUNKS > 0 ? CHUNKS : kMaxChunks;
  constexpr int64_t kVectorCodes = kLanes * BITS / 8;  // bytes of one vector's codes
  const int64_t D = int64_t(nc) * kLanes, width = it.end - it.begin;
  const int64_t stride = (width + kLanes - 1) / kLanes * kLanes;  // per head, whole vectors
  const int heads = kv_heads * G;
  const int64_t group = layer.group, packed = layer.packed;
  const int64_t coded = it.n / group * group;  // positions [0, coded) are codes
  const int64_t coded_end = std::min(it.end, coded);
  const int64_t block_bytes = kv_heads * packed;

  vf qv[kMaxBlockHeads][kCap];
  for (int g = 0; g < heads; ++g)
    for (int c = 0; c < nc; ++c) qv[g][c] = load(it.q + g * D + c * kLanes) * scale;

  // Pass 1: scores.
  vf qk[kMaxBlockHeads][kCap];   // q times the key group's scales
  float bias[kMaxBlockHeads];    // q . the key group's minimums
  alignas(64) float params[2 * kMaxChunks * kLanes];
  alignas(64) vf pending[kMaxBlockHeads][4];  // four tokens' dot products per query head
  for (int64_t t = it.begin; t < it.begin + kAhead && t < coded_end; ++t)
    prefetch(layer.k_codes(it.slots[t], it.head), block_bytes);
  for (int64_t t = it.begin; t < coded_end;) {
    const int64_t key_group = t / group, stop = std::min(coded_end, (key_group + 1) * group);
    for (int h = 0; h < kv_heads; ++h) {
      load_key_group(layer, it.slots, key_group, it.head + h, params);
      for (int g = h * G; g < (h + 1) * G; ++g) {
        vf m = vf{};
        for (int c = 0; c < nc; ++c) {
          qk[g][c] = qv[g][c] * load(params + c * kLanes);
          m += qv[g][c] * load(params + D + c * kLanes);
        }
        bias[g] = hsum(m);
      }
    }
    // Four tokens at a time, their sums reduced together (hsum4), as
    // decode_attention_codes_cpu.cpp does; then one at a time.
    for (; t < stop; t += 4) {
      const int tokens = stop - t < 4 ? int(stop - t) : 4;
      for (int j = 0; j < tokens; ++j) {
        if (t + j + kAhead < coded_end)
          prefetch(layer.k_codes(it.slots[t + j + kAhead], it.head), block_bytes);
        const uint8_t* kp = layer.k_codes(it.slots[t + j], it.head);
        for (int h = 0; h < kv_heads; ++h) {
          vf kv[kCap];
          for (int c = 0; c < nc; ++c) kv[c] = load_codes<BITS>(kp + h * packed + c * kVectorCodes);
          for (int g = h * G; g < (h + 1) * G; ++g) {
            vf acc = qk[g][0] * kv[0];
            for (int c = 1; c < nc; ++c) acc += qk[g][c] * kv[c];
            pending[g][j] = acc;
          }
        }
      }
      for (int g = 0; g < heads; ++g) {
        float* row = it.scores + g * stride + (t - it.begin);
        if (tokens == 4) {
          const v4 sc = hsum4(pending[g][0], pending[g][1], pending[g][2], pending[g][3]) + bias[g];
          std::memcpy(row, &sc, sizeof sc);
        } else {
          for (int j = 0; j < tokens; ++j) row[j] = hsum(pending[g][j]) + bias[g];
        }
      }
    }
  }
  for (int64_t t = std::max(it.begin, coded); t < it.end; ++t) {  // the window's, float
    for (int h = 0; h < kv_heads; ++h) {
      const T* kp = layer.k_window(it.row, t % group, it.head + h);
      vf kv[kCap];
      for (int c = 0; c < nc; ++c) kv[c] = load(kp + c * kLanes);
      for (int g = h * G; g < (h + 1) * G; ++g) {
        vf acc = qv[g][0] * kv[0];
        for (int c = 1; c < nc; ++c) acc += qv[g][c] * kv[c];
        it.scores[g * stride + (t - it.begin)] = hsum(acc);
      }
    }
  }
  for (int g = 0; g < heads; ++g) {
    float* row = it.scores + g * stride;
    if (softcap > 0.0f) softcap_in_place(row, width, softcap);
    const float top = max_of(row, width);
    it.partial[g * (D + 2)] = top;
    it.partial[g * (D + 2) + 1] = exp_in_place(row, width, top);
  }

  // Pass 2: weighted sum of V.
  const int64_t nv = layer.nv, chunk = layer.chunk;
  int value_group_of[kCap];  // each vector's value group
  for (int c = 0; c < nc; ++c) value_group_of[c] = int(c * kLanes / layer.value_group);
  vf o[kMaxBlockHeads][kCap];
  for (int g = 0; g < heads; ++g)
    for (int c = 0; c < nc; ++c) o[g][c] = vf{};
  for (int64_t t = it.begin; t < it.begin + kAhead && t < coded_end; ++t)
    prefetch(layer.v_codes(it.slots[t], it.head), block_bytes);
  for (int64_t t = it.begin; t < coded_end; ++t) {
    if (t + kAhead < coded_end) {
      prefetch(layer.v_codes(it.slots[t + kAhead], it.head), block_bytes);
      __builtin_prefetch(layer.params(it.slots[t + kAhead], it.head));
    }
    const int64_t slot = it.slots[t];
    const uint8_t* vp = layer.v_codes(slot, it.head);
    for (int h = 0; h < kv_heads; ++h) {
      const uint16_t* meta = layer.params(slot, it.head + h) + chunk;
      float vs[kMaxValueGroups], vm[kMaxValueGroups];
      for (int64_t i = 0; i < nv; ++i) {
        vs[i] = half_to_float(meta[i]);
        vm[i] = half_to_float(meta[nv + i]);
      }
      vf vv[kCap];
      for (int c = 0; c < nc; ++c) {
        const int i = value_group_of[c];
        vv[c] = load_codes<BITS>(vp + h * packed + c * kVectorCodes) * vs[i] + vm[i];
      }
      for (int g = h * G; g < (h + 1) * G; ++g) {
        const vf p = splat(it.scores[g * stride + (t - it.begin)]);
        for (int c = 0; c < nc; ++c) o[g][c] += p * vv[c];
      }
    }
  }
  for (int64_t t = std::max(it.begin, coded); t < it.end; ++t) {
    for (int h = 0; h < kv_heads; ++h) {
      const T* vp = layer.v_window(it.row, t % group, it.head + h);
      vf vv[kCap];
      for (int c = 0; c < nc; ++c) vv[c] = load(vp + c * kLanes);
      for (int g = h * G; g < (h + 1) * G; ++g) {
        const vf p = splat(it.scores[g * stride + (t - it.begin)]);
        for (int c = 0; c < nc; ++c) o[g][c] += p * vv[c];
      }
    }
  }
  for (int g = 0; g < heads; ++g)
    for (int c = 0; c < nc; ++c) store(it.partial + g * (D + 2) + 2 + c * kLanes, o[g][c]);
}

// The decode rows' attention over one layer of a KIVI pool: row b attends
// positions first(b) .. n - 1 of req_to_token row rows[b] (n = seq_lens[b] >= 1),
// split into spans and merged as decode_attention does.
template <typename T, int BITS>
int decode_attention_kivi(const T* q, int64_t q_stride, const KiviLayer<T>& layer,
                          const int64_t* table, int64_t table_stride, const int64_t* rows,
                          const int64_t* seq_lens, T* out, int64_t out_stride, int64_t B,
                          int64_t H, float scale, int64_t window, float softcap) {
  const int64_t Hkv = layer.Hkv, D = layer.D;
  if (H % Hkv != 0 || H / Hkv > kMaxGroup || D % kLanes != 0 || D / kLanes > kMaxChunks)
    return 1;
  for (int64_t b = 0; b < B; ++b)
    if (seq_lens[b] < 1) return 1;
  const int G = int(H / Hkv), chunks = int(D / kLanes);
  const int kv_heads = block_kv_heads(Hkv, G);
  const int64_t blocks = Hkv / kv_heads;

  // Spans first_span[b] .. first_span[b + 1] - 1 belong to row b; they cover its
  // positions first_position(b) .. n - 1.
  const auto first_position = [&](int64_t b) -> int64_t {
    return window > 0 ? std::max<int64_t>(0, seq_lens[b] - window) : 0;
  };
  int64_t* first_span = static_cast<int64_t*>(std::malloc((B + 1) * sizeof(int64_t)));
  if (first_span == nullptr) return 2;
  first_span[0] = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t positions = seq_lens[b] - first_position(b);
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
      const int64_t n = seq_lens[b], first = first_position(b);
      const int64_t span = span_length(n - first);
      const int64_t begin = first + (s - first_span[b]) * span;
      const int64_t head = block * kv_heads;  // first KV head of the block
      const KiviItem<T> it{table + rows[b] * table_stride,
                           rows[b],
                           n,
                           begin,
                           std::min(begin + span, n),
                           q + b * q_stride + head * G * D,
                           head,
                           scores,
                           partials + s * span_stride + head * G * (D + 2)};
      if (D == 64)
        attend_span_kivi<T, BITS, 64 / kLanes>(layer, it, kv_heads, G, chunks, scale, softcap);
      else if (D == 128)
        attend_span_kivi<T, BITS, 128 / kLanes>(layer, it, kv_heads, G, chunks, scale, softcap);
      else
        attend_span_kivi<T, BITS, 0>(layer, it, kv_heads, G, chunks, scale, softcap);
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

// Over one layer of a KIVI pool of BITS-bit codes: k/v (slots, Hkv, D * BITS / 8)
// uint8, meta (slots, Hkv, M) float16, window_k/window_v (rows, group, Hkv, D) of
// T, as radixlm.runtime.mem_cache.kivi lays them out; seq_lens: (B,) positions
// stored per row, its new token's included. q and out are T. window <= 0: no
// sliding window; softcap 0: no cap. Returns 0 on success, 1 for shapes or a
// layout the kernel does not take, 2 when its scratch memory could not be allocated.
#define RADIXLM_DECODE_ATTENTION_KIVI(NAME, T, BITS)                                          \
  extern "C" int NAME(const T* q, int64_t q_stride, const uint8_t* k, const uint8_t* v,        \
                      const uint16_t* meta, const T* window_k, const T* window_v,              \
                      const int64_t* table, int64_t table_stride, const int64_t* rows,         \
                      const int64_t* seq_lens, T* out, int64_t out_stride, int64_t B,          \
                      int64_t H, int64_t Hkv, int64_t D, int64_t group, int64_t value_group,   \
                      float scale, int64_t window, float softcap) {                            \
    KiviLayer<T> layer{k, v, meta, window_k, window_v};                                        \
    if (!kivi_layer(layer, BITS, Hkv, D, group, value_group)) return 1;                        \
    return decode_attention_kivi<T, BITS>(q, q_stride, layer, table, table_stride, rows,       \
                                          seq_lens, out, out_stride, B, H, scale, window,      \
                                          softcap);                                            \
  }

RADIXLM_DECODE_ATTENTION_KIVI(radixlm_decode_attention_kivi_f32_b4, float, 4)
RADIXLM_DECODE_ATTENTION_KIVI(radixlm_decode_attention_kivi_f32_b2, float, 2)
RADIXLM_DECODE_ATTENTION_KIVI(radixlm_decode_attention_kivi_bf16_b4, uint16_t, 4)
RADIXLM_DECODE_ATTENTION_KIVI(radixlm_decode_attention_kivi_bf16_b2, uint16_t, 2)
