// Decode attention over the KV pool, reading K/V slots in place (CPU).
//
// One decode row attends to the first prefix_lens[b] slots of its req_to_token
// row, then to its own new token (k_new/v_new), with grouped-query heads: query
// head h reads KV head h / G. The plain-torch gather + SDPA path copies every
// row's K/V out of the pool first (hundreds of MB per step for a large batch);
// this kernel streams them from the pool once.
//
// Work item = (row, KV head), dynamically scheduled over OpenMP threads (rows
// have very different lengths). Per item, two passes over the slots:
//   1. scores s[g][t] = scale * q_g . k_t for the G query heads of the KV head,
//   2. p = exp(s - max), out_g = sum_t p[g][t] v_t / sum_t p[g][t].
// Arithmetic is float32 whatever the storage type (float32 or bfloat16).
//
// Built by radixlm.kernels.native with -O3 -march=native -fopenmp; GCC vector
// extensions keep it portable (AVX-512, AVX2 and NEON all lower them). The
// OpenMP runtime is torch's own: this library asks for libgomp.so.1, which
// torch has loaded already, so both share one thread pool.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace {

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef uint32_t vu __attribute__((vector_size(64)));
typedef uint16_t vh __attribute__((vector_size(32)));
constexpr int kLanes = 16;
constexpr int kMaxGroup = 8;   // query heads per KV head
constexpr int kMaxChunks = 16;  // head_dim / kLanes, so head_dim <= 256

inline vf splat(float x) { return vf{} + x; }

inline vf load(const float* p) {
  vf r;
  std::memcpy(&r, p, sizeof r);
  return r;
}

inline vf load(const uint16_t* p) {  // bfloat16 -> float32: the high half of the bits
  vh h;
  std::memcpy(&h, p, sizeof h);
  vu u = __builtin_convertvector(h, vu) << 16;
  vf r;
  std::memcpy(&r, &u, sizeof r);
  return r;
}

inline void store(float* p, vf x) { std::memcpy(p, &x, sizeof x); }

inline void store(uint16_t* p, vf x) {  // float32 -> bfloat16, round to nearest even
  vu u;
  std::memcpy(&u, &x, sizeof u);
  vu is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  vu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  vu quiet = (u >> 16) | 0x40u;
  vh h = __builtin_convertvector(is_nan ? quiet : rounded, vh);
  std::memcpy(p, &h, sizeof h);
}

inline float hsum(vf x) {
  typedef float v8 __attribute__((vector_size(32)));
  typedef float v4 __attribute__((vector_size(16)));
  v8 a = __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7) +
         __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
  v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
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

struct Item {
  int64_t n;              // cached slots
  const int64_t* slots;   // n slot ids
  int64_t kv_stride;      // elements between consecutive slots (Hkv * D)
  int group;              // G
  float scale;
  float* scores;          // G * (n + 1) floats of scratch
};

// One (row, KV head). q/out: G heads of D; k/v: the pool at this KV head;
// k_new/v_new: the row's own token at this KV head. CHUNKS = D / 16, or 0 when
// only known at run time (chunks).
template <typename T, int CHUNKS>
void attend(const Item& it, int chunks, const T* q, const T* k, const T* v, const T* k_new,
            const T* v_new, T* out) {
  const int nc = CHUNKS > 0 ? CHUNKS : chunks;
  constexpr int kCap = CHUNKS > 0 ? CHUNKS : kMaxChunks;
  const int64_t n = it.n, width = n + 1, D = int64_t(nc) * kLanes;
  const int G = it.group;

  vf qv[kMaxGroup][kCap];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < nc; ++c) qv[g][c] = load(q + g * D + c * kLanes) * it.scale;

  // Pass 1: scores, the new token last.
  float top[kMaxGroup];
  for (int g = 0; g < G; ++g) top[g] = -INFINITY;
  for (int64_t t = 0; t <= n; ++t) {
    if (t + 8 < n) __builtin_prefetch(k + it.slots[t + 8] * it.kv_stride);
    const T* kp = t < n ? k + it.slots[t] * it.kv_stride : k_new;
    vf kv[kCap];
    for (int c = 0; c < nc; ++c) kv[c] = load(kp + c * kLanes);
    for (int g = 0; g < G; ++g) {
      vf acc = qv[g][0] * kv[0];
      for (int c = 1; c < nc; ++c) acc += qv[g][c] * kv[c];
      float s = hsum(acc);
      it.scores[g * width + t] = s;
      top[g] = s > top[g] ? s : top[g];
    }
  }

  // Softmax numerators in place, and their sums.
  float inv_sum[kMaxGroup];
  for (int g = 0; g < G; ++g) {
    float* s = it.scores + g * width;
    vf acc = {};
    int64_t t = 0;
    for (; t + kLanes <= width; t += kLanes) {
      vf e = exp_nonpositive(load(s + t) - top[g]);
      store(s + t, e);
      acc += e;
    }
    float sum = hsum(acc);
    for (; t < width; ++t) {
      s[t] = std::exp(s[t] - top[g]);
      sum += s[t];
    }
    inv_sum[g] = 1.0f / sum;
  }

  // Pass 2: weighted sum of V.
  vf o[kMaxGroup][kCap];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < nc; ++c) o[g][c] = vf{};
  for (int64_t t = 0; t <= n; ++t) {
    if (t + 8 < n) __builtin_prefetch(v + it.slots[t + 8] * it.kv_stride);
    const T* vp = t < n ? v + it.slots[t] * it.kv_stride : v_new;
    vf vv[kCap];
    for (int c = 0; c < nc; ++c) vv[c] = load(vp + c * kLanes);
    for (int g = 0; g < G; ++g) {
      vf p = splat(it.scores[g * width + t]);
      for (int c = 0; c < nc; ++c) o[g][c] += p * vv[c];
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < nc; ++c) store(out + g * D + c * kLanes, o[g][c] * inv_sum[g]);
}

template <typename T>
int decode_attention(const T* q, int64_t q_stride, const T* k, const T* v, const int64_t* table,
                     int64_t table_stride, const int64_t* rows, const int64_t* prefix_lens,
                     const T* k_new, int64_t k_new_stride, const T* v_new,
                     int64_t v_new_stride, T* out,
                     int64_t out_stride, int64_t B, int64_t H, int64_t Hkv, int64_t D,
                     float scale) {
  if (Hkv <= 0 || H % Hkv != 0 || H / Hkv > kMaxGroup || D % kLanes != 0 ||
      D / kLanes > kMaxChunks || D <= 0)
    return 1;
  const int G = int(H / Hkv), chunks = int(D / kLanes);
  int failed = 0;
#pragma omp parallel
  {
    float* scratch = nullptr;
    int64_t capacity = 0;
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < B * Hkv; ++item) {
      const int64_t b = item / Hkv, h = item % Hkv, n = prefix_lens[b];
      const int64_t need = G * (n + 1);
      if (need > capacity) {
        std::free(scratch);
        capacity = need * 2;
        scratch = static_cast<float*>(std::malloc(capacity * sizeof(float)));
        if (scratch == nullptr) {
          capacity = 0;
#pragma omp atomic write
          failed = 2;
          continue;
        }
      }
      const Item it{n, table + rows[b] * table_stride, Hkv * D, G, scale, scratch};
      const T* qp = q + b * q_stride + h * G * D;
      const T* kn = k_new + b * k_new_stride + h * D;
      const T* vn = v_new + b * v_new_stride + h * D;
      T* op = out + b * out_stride + h * G * D;
      if (chunks == 4)
        attend<T, 4>(it, chunks, qp, k + h * D, v + h * D, kn, vn, op);
      else if (chunks == 8)
        attend<T, 8>(it, chunks, qp, k + h * D, v + h * D, kn, vn, op);
      else
        attend<T, 0>(it, chunks, qp, k + h * D, v + h * D, kn, vn, op);
    }
    std::free(scratch);
  }
  return failed;
}

}  // namespace

// The exported entry points (called through ctypes). Returns 0 on success, 1 for
// shapes the kernel does not take, 2 when scratch memory could not be allocated.
#define RADIXLM_DECODE_ATTENTION(NAME, T)                                                   \
  extern "C" int NAME(const T* q, int64_t q_stride, const T* k, const T* v,                  \
                      const int64_t* table, int64_t table_stride, const int64_t* rows,       \
                      const int64_t* prefix_lens, const T* k_new, int64_t k_new_stride,     \
                      const T* v_new, int64_t v_new_stride, T* out, int64_t out_stride,      \
                      int64_t B, int64_t H, int64_t Hkv, int64_t D, float scale) {           \
    return decode_attention<T>(q, q_stride, k, v, table, table_stride, rows, prefix_lens,    \
                               k_new, k_new_stride, v_new, v_new_stride, out, out_stride, B, \
                               H, Hkv, D, scale);                                            \
  }

RADIXLM_DECODE_ATTENTION(radixlm_decode_attention_f32, float)
RADIXLM_DECODE_ATTENTION(radixlm_decode_attention_bf16, uint16_t)
