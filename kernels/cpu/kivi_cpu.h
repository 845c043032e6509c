// A KIVI KV pool as radixlm's CPU attention kernels read it in place
// (radixlm.runtime.mem_cache.kivi has the layout and the reading rule): b-bit codes
// packed in bytes, float16 parameters, float windows. Shared by the decode and
// extend kernels over it (decode_attention_kivi_cpu.cpp, extend_attention_kivi_cpu.cpp).
//
// For a sequence of n tokens (this pass's included), position p < n / G * G is a
// code: key = code * kscale[g, d] + kmin[g, d] (its group g = p / G's parameters,
// spread over the group's G slots: the slot of position gG + j holds
// P[j c .. (j + 1) c) of P = [scales (D), minimums (D)] in meta[0 .. c)), value =
// code * vscale[slot, d / Vg] + vmin[slot, d / Vg] (meta[c .. c + nv), [c + nv,
// c + 2 nv)); the rest, n / G * G <= p < n, is window[row, p % G] (float). All in
// float32 from the float16 parameters.

#pragma once

#include <cstdint>
#include <cstring>

#include "vector_cpu.h"

namespace {

// One layer of a KIVI pool, and where its rows lie.
template <typename T>
struct KiviLayer {
  const uint8_t* k;       // (slots, Hkv, P) packed codes, P = D * bits / 8
  const uint8_t* v;
  const uint16_t* meta;   // (slots, Hkv, M) float16
  const T* window_k;      // (rows, G, Hkv, D) the model's dtype
  const T* window_v;
  int64_t Hkv, D;
  int64_t group;          // G: positions per key group
  int64_t value_group;    // Vg: value channels per group
  int64_t packed;         // P
  int64_t chunk;          // c = 2 D / G
  int64_t nv;             // D / Vg
  int64_t meta_dim;       // M = c + 2 nv

  // The codes of slot's KV head h, and its parameters.
  const uint8_t* k_codes(int64_t slot, int64_t h) const { return k + (slot * Hkv + h) * packed; }
  const uint8_t* v_codes(int64_t slot, int64_t h) const { return v + (slot * Hkv + h) * packed; }
  const uint16_t* params(int64_t slot, int64_t h) const {
    return meta + (slot * Hkv + h) * meta_dim;
  }
  // The window of req_to_token row `row`, entry j (position p: j = p % G), KV head h.
  const T* k_window(int64_t row, int64_t j, int64_t h) const {
    return window_k + ((row * group + j) * Hkv + h) * D;
  }
  const T* v_window(int64_t row, int64_t j, int64_t h) const {
    return window_v + ((row * group + j) * Hkv + h) * D;
  }
};

// The layer's layout from its shape, or false where the kernels cannot read it:
// 4- or 2-bit codes, value groups of whole vectors of either ISA (16 floats), a
// head dim of whole value groups, G dividing 2 D.
template <typename T>
bool kivi_layer(KiviLayer<T>& layer, int bits, int64_t Hkv, int64_t D, int64_t group,
                int64_t value_group) {
  if ((bits != 4 && bits != 2) || Hkv <= 0 || D <= 0 || group <= 0 || value_group <= 0 ||
      value_group % 16 != 0 || D % value_group != 0 || (2 * D) % group != 0)
    return false;
  layer.Hkv = Hkv;
  layer.D = D;
  layer.group = group;
  layer.value_group = value_group;
  layer.packed = D * bits / 8;
  layer.chunk = 2 * D / group;
  layer.nv = D / value_group;
  layer.meta_dim = layer.chunk + 2 * layer.nv;
  return true;
}

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

// kLanes codes from the packed bytes at p (code i in byte i / (8 / BITS), bits
// (i % (8 / BITS)) * BITS), as floats: each byte copied to the lanes of its codes
// (one byte shuffle), widened to 32 bits, shifted by lane and masked. Five
// instructions a vector, no table.
template <int BITS>
inline vf load_codes(const uint8_t* p) {
  constexpr int kPerByte = 8 / BITS;
  uint64_t word = 0;
  std::memcpy(&word, p, kLanes * BITS / 8);
  const __m128i bytes = _mm_cvtsi64_si128(int64_t(word));
  const __m128i spread =
      BITS == 4 ? _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)
                : _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const __m128i lanes = _mm_shuffle_epi8(bytes, spread);
#if RADIXLM_VECTOR_BYTES == 64
  const vi wide = (vi)_mm512_cvtepu8_epi32(lanes);
#else
  const vi wide = (vi)_mm256_cvtepu8_epi32(lanes);
#endif
  const vi shifts = lane_index() % kPerByte * BITS;
  return __builtin_convertvector((wide >> shifts) & ((1 << BITS) - 1), vf);
}

// Key group g's parameters of KV head h, as float32: scales to out[0 .. D),
// minimums to out[D .. 2 D). slots: the sequence's slots by position.
template <typename T>
void load_key_group(const KiviLayer<T>& layer, const int64_t* slots, int64_t g, int64_t h,
                    float* out) {
  const int64_t c = layer.chunk;
  for (int64_t j = 0; j < layer.group; ++j) {
    const uint16_t* share = layer.params(slots[g * layer.group + j], h);
    for (int64_t i = 0; i < c; ++i) out[j * c + i] = half_to_float(share[i]);
  }
}

}  // namespace
