// Dequantizes torch's packed CPU int4 weight (torch._convert_weight_to_int4pack_for_cpu)
// to a float32 or bfloat16 matrix in one pass, for the GEMM of a prompt pass.
//
// Layout (torch 2.13, read back and checked by radixlm.runtime.layers.quantization):
// rows in blocks of B; a block is (K, B/2) bytes, byte (k, j) holding row j's code in
// its low nibble and row j + B/2's in its high one; the rows past the last whole block
// (rest < B) are (K, rest/2) bytes holding rows 2j and 2j + 1.
//
//   w[n][k] = (code - 8) * scale[k / group][n] + zero[k / group][n]
//
// scales_zeros is (K / group, N, 2) bfloat16, (scale, zero) pairs. The value is
// computed in float32 (exact for 4-bit codes and bf16 scales) and rounded once.

#include <cstdint>
#include <cstring>

namespace {

inline float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t float_to_bf16(float f) {  // round to nearest even (finite values)
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

inline void store(float* out, int64_t i, float v) { out[i] = v; }
inline void store(uint16_t* out, int64_t i, float v) { out[i] = float_to_bf16(v); }

constexpr int64_t K_TILE = 64;  // columns per tile: a tile's bytes stay in L1

// Rows [row0, row0 + rows) whose codes sit at ``bytes`` (K rows of ``width`` bytes);
// ``row_of(j, high)`` is the row (within these) of byte j's low or high nibble.
template <typename Out, typename RowOf>
void dequant_rows(const uint8_t* bytes, int64_t width, const uint16_t* scales_zeros, Out* out,
                  int64_t row0, int64_t n, int64_t k, int64_t group, RowOf row_of) {
  for (int64_t k0 = 0; k0 < k; k0 += K_TILE) {
    const int64_t k1 = k0 + K_TILE < k ? k0 + K_TILE : k;
    for (int64_t j = 0; j < width; ++j) {
      for (int high = 0; high < 2; ++high) {
        const int64_t row = row0 + row_of(j, high);
        const int shift = 4 * high;
        for (int64_t g0 = k0; g0 < k1; g0 = (g0 / group + 1) * group) {
          const int64_t g1 = (g0 / group + 1) * group < k1 ? (g0 / group + 1) * group : k1;
          const uint16_t* sz = scales_zeros + ((g0 / group) * n + row) * 2;
          const float scale = bf16_to_float(sz[0]), zero = bf16_to_float(sz[1]);
          for (int64_t kk = g0; kk < g1; ++kk) {
            const int code = (bytes[kk * width + j] >> shift) & 0xF;
            store(out, row * k + kk, static_cast<float>(code - 8) * scale + zero);
          }
        }
      }
    }
  }
}

template <typename Out>
int dequant_int4(const uint8_t* packed, const uint16_t* scales_zeros, Out* out, int64_t n,
                 int64_t k, int64_t group, int64_t block) {
  if (block <= 0 || block % 2 || group <= 0 || k % group || n % 2) return 1;
  const int64_t whole = n / block;
  const int64_t half = block / 2;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b <= whole; ++b) {
    if (b < whole) {
      dequant_rows(packed + b * k * half, half, scales_zeros, out, b * block, n, k, group,
                   [half](int64_t j, int high) { return j + high * half; });
    } else if (n > whole * block) {
      const int64_t rest = n - whole * block;
      dequant_rows(packed + whole * k * half, rest / 2, scales_zeros, out, whole * block, n, k,
                   group, [](int64_t j, int high) { return 2 * j + high; });
    }
  }
  return 0;
}

}  // namespace

extern "C" {

// packed: torch's layout (above), n * k / 2 bytes; out: (n, k). Returns 0, or 1 for
// sizes the layout cannot have.
int radixlm_dequant_int4_f32(const uint8_t* packed, const uint16_t* scales_zeros, float* out,
                             int64_t n, int64_t k, int64_t group, int64_t block) {
  return dequant_int4(packed, scales_zeros, out, n, k, group, block);
}

int radixlm_dequant_int4_bf16(const uint8_t* packed, const uint16_t* scales_zeros, uint16_t* out,
                              int64_t n, int64_t k, int64_t group, int64_t block) {
  return dequant_int4(packed, scales_zeros, out, n, k, group, block);
}

}  // extern "C"
