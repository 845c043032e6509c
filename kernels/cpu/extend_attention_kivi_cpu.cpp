// Prefill ("extend") attention over a KIVI KV pool (CPU): the extend kernel
// (extend_attention_cpu.cpp, included) with its pack phase reading a KIVI pool by
// position (kivi_cpu.h): each request's keys and values of each KV head are
// dequantized into the float32 panels once, codes unpacked a vector at a time,
// positions past the last whole group copied from the row's window. The attend
// phase is the float kernel's, unchanged.
//
// The pass's new tokens are in the pool already (KiviWrites stores them before
// attention), so request b's n = prefix_lens[b] + extend_lens[b] positions are
// all read from it: codes below n / G * G, the window from there.
//
// A library of its own, like decode_attention_codes_cpu.cpp: the float kernel
// compiles as it did.

#include "extend_attention_cpu.cpp"
#include "kivi_cpu.h"

namespace {

constexpr int kMaxValueGroups = 256 / 16;  // D / Vg: head dim <= 256, Vg a multiple of 16

// Keys [p * kPanel, (p + 1) * kPanel) (positions base + key) of one request and KV
// head h into panel p ((D, kPanel), zero past the last key), and their values into
// rows of v_out, as floats. slots: the request's slots from position 0; row: its
// req_to_token row; n: its positions stored; params: 2 D floats of scratch.
template <typename T, int BITS>
void pack_panel_kivi(const KiviLayer<T>& layer, const int64_t* slots, int64_t row, int64_t n,
                     int64_t base, int64_t h, int64_t p, float* kt_out, float* v_out,
                     float* params) {
  const int64_t D = layer.D, group = layer.group, coded = n / group * group;
  const int64_t nv = layer.nv;
  float* panel = kt_out + p * D * kPanel;
  int64_t loaded = -1;  // the key group whose parameters are in params
  alignas(64) float column[kLanes];
  for (int j = 0; j < kPanel; ++j) {
    const int64_t key = p * kPanel + j, position = base + key;
    if (position >= n) {
      for (int64_t d = 0; d < D; ++d) panel[d * kPanel + j] = 0.0f;
      continue;
    }
    float* vo = v_out + key * D;
    if (position >= coded) {  // the window's, float
      const T* kr = layer.k_window(row, position % group, h);
      const T* vr = layer.v_window(row, position % group, h);
      for (int64_t d = 0; d < D; d += kLanes) store(vo + d, load(vr + d));
      for (int64_t d = 0; d < D; ++d) panel[d * kPanel + j] = to_float(kr[d]);
      continue;
    }
    if (position / group != loaded) {
      loaded = position / group;
      load_key_group(layer, slots, loaded, h, params);
    }
    const int64_t slot = slots[position];
    const uint8_t* kp = layer.k_codes(slot, h);
    const uint8_t* vp = layer.v_codes(slot, h);
    const uint16_t* meta = layer.params(slot, h) + layer.chunk;
    float vs[kMaxValueGroups], vm[kMaxValueGroups];
    for (int64_t i = 0; i < nv; ++i) {
      vs[i] = half_to_float(meta[i]);
      vm[i] = half_to_float(meta[nv + i]);
    }
    for (int64_t d = 0; d < D; d += kLanes) {
      const int64_t i = d / layer.value_group;
      store(vo + d, load_codes<BITS>(vp + d * BITS / 8) * vs[i] + vm[i]);
      store(column, load_codes<BITS>(kp + d * BITS / 8) * load(params + d) + load(params + D + d));
      for (int l = 0; l < kLanes; ++l) panel[(d + l) * kPanel + j] = column[l];
    }
  }
}

template <typename T, int BITS>
int extend_attention_kivi(const ExtendArgs<T, T>& a, const KiviLayer<T>& layer) {
  const int64_t H = a.H, Hkv = a.Hkv, D = a.D;
  if (H % Hkv != 0 || H / Hkv > kMaxTileRows || D % kLanes != 0 || D / kLanes > kMaxChunks ||
      a.B < 0)
    return 1;
  const Plan plan(a.prefix_lens, a.extend_lens, a.B, Hkv, H / Hkv, a.window);
  const int64_t total_panels = plan.first_panel[a.B];
  // Uninitialised: every panel is written whole by pack_panel_kivi, every state by run_strip.
  const std::unique_ptr<float[]> kt(new float[total_panels * D * kPanel]);
  const std::unique_ptr<float[]> vs(new float[total_panels * kPanel * D]);
  const std::unique_ptr<TileState[]> states(new TileState[omp_get_max_threads() * kStripTiles]);
  const int64_t num_strips = int64_t(plan.strips.size());
#pragma omp parallel
  {
    alignas(64) float params[2 * kMaxChunks * kLanes];
#pragma omp for schedule(static)
    for (int64_t i = 0; i < total_panels; ++i) {
      const int64_t b = plan.panel_owner[i];
      const int64_t h = (i - plan.first_panel[b]) / plan.panels[b];
      const int64_t first = plan.head_panel(b, h);
      const int64_t* slots = a.table + a.rows[b] * a.table_stride;
      const int64_t n = a.prefix_lens[b] + a.extend_lens[b];
      pack_panel_kivi<T, BITS>(layer, slots, a.rows[b], n, plan.base[b], h, i - first,
                               kt.get() + first * D * kPanel, vs.get() + first * kPanel * D,
                               params);
    }
    TileState* st = states.get() + omp_get_thread_num() * kStripTiles;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < num_strips; ++i)
      run_strip(a, plan, plan.strips[i], kt.get(), vs.get(), st);
  }
  return 0;
}

}  // namespace

// Over one layer of a KIVI pool of BITS-bit codes (as decode_attention_kivi_cpu.cpp
// takes it); the requests as radixlm_extend_attention_* takes them, their new
// tokens stored. Returns 0 on success, 1 for shapes or a layout the kernel does not
// take, 2 when its scratch memory could not be allocated.
#define RADIXLM_EXTEND_ATTENTION_KIVI(NAME, T, BITS)                                           \
  extern "C" int NAME(const T* q, int64_t q_stride, const uint8_t* k, const uint8_t* v,        \
                      const uint16_t* meta, const T* window_k, const T* window_v,              \
                      const int64_t* table, int64_t table_stride, const int64_t* rows,         \
                      const int64_t* prefix_lens, const int64_t* extend_lens,                  \
                      const int64_t* starts, T* out, int64_t out_stride, int64_t B, int64_t H, \
                      int64_t Hkv, int64_t D, int64_t group, int64_t value_group, float scale, \
                      int64_t window, float softcap) {                                         \
    KiviLayer<T> layer{k, v, meta, window_k, window_v};                                        \
    if (!kivi_layer(layer, BITS, Hkv, D, group, value_group)) return 1;                        \
    try {                                                                                      \
      return extend_attention_kivi<T, BITS>(                                                   \
          {q, q_stride, nullptr, nullptr, table, table_stride, rows, prefix_lens, extend_lens, \
           starts, out, out_stride, B, H, Hkv, D, scale, window, softcap, nullptr, nullptr},   \
          layer);                                                                              \
    } catch (const std::bad_alloc&) {                                                          \
      return 2;                                                                                \
    }                                                                                          \
  }

RADIXLM_EXTEND_ATTENTION_KIVI(radixlm_extend_attention_kivi_f32_b4, float, 4)
RADIXLM_EXTEND_ATTENTION_KIVI(radixlm_extend_attention_kivi_f32_b2, float, 2)
RADIXLM_EXTEND_ATTENTION_KIVI(radixlm_extend_attention_kivi_bf16_b4, uint16_t, 4)
RADIXLM_EXTEND_ATTENTION_KIVI(radixlm_extend_attention_kivi_bf16_b2, uint16_t, 2)
