// The few-row decode step over a quantized KV pool (int8 / fp8 codes and bfloat16
// scales): small_batch_cpu.cpp's decode_step instantiated for code types, which
// quantizes each new K/V head as kv_quant.quantize does (quantize_head) and attends
// with decode_attention_codes_cpu.cpp's kernel. A library of its own, as that
// kernel is: in one unit with the float kernels GCC compiles their unchanged code
// differently (slower, measured); radixlm.kernels.cpu.small_batch loads both.

#include "decode_attention_codes_cpu.cpp"
#include "small_batch_cpu.cpp"

// radixlm_small_decode_step_<W>_<C>: the decode step over a quantized pool,
// k_pool/v_pool (num_layers, slots, Hkv, D) codes of type C and k_scales/v_scales
// (num_layers, slots, Hkv) bfloat16 their scales (scale_layer_stride between
// layers); the new tokens' K/V are quantized into them per head, as
// kv_quant.quantize does. Otherwise as radixlm_small_decode_step_<W>.
#define RADIXLM_SMALL_DECODE_STEP_CODES(SUFFIX, W, C)                                        \
  extern "C" int radixlm_small_decode_step_##SUFFIX(                                          \
      const Layer<W>* layers, int64_t num_layers, const W* final_norm, float eps,             \
      float* residual, const float* cos, const float* sin, C* k_pool, C* v_pool,              \
      int64_t pool_layer_stride, const int64_t* table, int64_t table_stride,                  \
      const int64_t* rows_of, const int64_t* prefix_lens, const int64_t* out_loc, float* out, \
      int64_t rows, int64_t hidden_size, int64_t heads, int64_t kv_heads, int64_t head_dim,   \
      int64_t intermediate, float scale, uint16_t* k_scales, uint16_t* v_scales,              \
      int64_t scale_layer_stride) {                                                           \
    return decode_step<W, C>(layers, num_layers, final_norm, eps, residual, cos, sin, k_pool, \
                             v_pool, pool_layer_stride, table, table_stride, rows_of,         \
                             prefix_lens, out_loc, out, rows, hidden_size, heads, kv_heads,   \
                             head_dim, intermediate, scale, k_scales, v_scales,               \
                             scale_layer_stride);                                             \
  }

RADIXLM_SMALL_DECODE_STEP_CODES(f32_i8, float, int8_t)
RADIXLM_SMALL_DECODE_STEP_CODES(f32_e4m3, float, Fp8E4M3)
RADIXLM_SMALL_DECODE_STEP_CODES(f32_e5m2, float, Fp8E5M2)
RADIXLM_SMALL_DECODE_STEP_CODES(bf16_i8, uint16_t, int8_t)
RADIXLM_SMALL_DECODE_STEP_CODES(bf16_e4m3, uint16_t, Fp8E4M3)
RADIXLM_SMALL_DECODE_STEP_CODES(bf16_e5m2, uint16_t, Fp8E5M2)

// The quantization of decode_step's new K/V alone, for the tests to hold bit for
// bit to kv_quant.quantize: x (n, D) float32 -> codes (n, D) of type C, scales (n,)
// bfloat16.
#define RADIXLM_QUANTIZE_HEADS(SUFFIX, C)                                                  \
  extern "C" int radixlm_quantize_heads_##SUFFIX(const float* x, int64_t n, int64_t D,   \
                                                 C* codes, uint16_t* scales) {           \
    for (int64_t i = 0; i < n; ++i) quantize_head(x + i * D, D, codes + i * D, scales + i); \
    return 0;                                                                              \
  }

RADIXLM_QUANTIZE_HEADS(i8, int8_t)
RADIXLM_QUANTIZE_HEADS(e4m3, Fp8E4M3)
RADIXLM_QUANTIZE_HEADS(e5m2, Fp8E5M2)
