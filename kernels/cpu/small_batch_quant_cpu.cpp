// The few-row products and the whole decode step over stored weights: int4 codes
// in torch's packed CPU layout, int8 codes in groups (or per row), and bfloat16
// weights in oneDNN's blocked layout (the copy its matmul reads: kBf16Blocked).
// small_batch_cpu.cpp's decode_step, instantiated with a QMatrix operand for the
// four matrices of each layer: norms, biases and the KV pool are the model's
// float type W, activations float32, as for float weights. A library of its own,
// as small_batch_codes_cpu.cpp is (radixlm.kernels.cpu.small_batch loads it).
//
// The operands (radixlm.runtime.layers.quantization's storages):
//
//   kInt4:  w[n][k] = (code[n][k] - 8) * scale[g][n] + zero[g][n], g = k / group;
//           codes in torch's CPU layout (torch._convert_weight_to_int4pack_for_cpu):
//           rows in blocks of B, a block (in, B/2) bytes, byte (k, j) holding row j
//           in its low nibble and row j + B/2 in its high one; the rows past the last
//           whole block (in, rest/2) bytes, byte (k, j) rows 2j (low) and 2j + 1;
//           scales: (in / group, out, 2) bfloat16 (scale, zero) pairs.
//   kInt8:  w[n][k] = q[n][k] * scale[n][g] + zero[n][g]; q (out, in) int8, scale and
//           zero (out, in / group) float32, zero null when every zero point is 0
//           (a per-row int8 weight is one group of `in`).
//   kBf16Blocked: bfloat16 w in blocks of 64 rows, a block (P/2, 64, 2), the inputs
//           padded to P (group); AVX512-BF16 builds only (pair_run).
//
// int4 sums each group's codes times the inputs first and applies the group's
// scale once (y += scale * sum(code * x) + (zero - 8 scale) * sum(x)), so a code
// costs one widening and one FMA per row; its block layout gives each input's
// codes of B rows in B/2 adjacent bytes: one load, two nibble vectors, an FMA
// each; a thread owns whole blocks. Arithmetic is float32. int8 runs on VNNI dot
// products of int8-quantized inputs where the build has them (int8_dot_cpu.h:
// the inputs rounded per 32 as llama.cpp does), else widened to float32; so does
// int4 where the build also has VBMI's byte permutes (int4_dot_block_tile). On dot
// products the result is the dequantized weights times the rounded inputs.

#include "decode_attention_codes_cpu.cpp"
#include "int8_dot_cpu.h"
#include "small_batch_cpu.cpp"

#include <vector>

namespace {

constexpr int64_t kInt4 = 1;
constexpr int64_t kInt8 = 2;
constexpr int64_t kBf16Blocked = 3;

// One quantized matrix, as radixlm.kernels.cpu.small_batch.QuantizedMatrix lays
// it out: six 8-byte fields.
struct QMatrix {
  int64_t kind;          // kInt4, kInt8 or kBf16Blocked
  const uint8_t* codes;  // kInt4: packed nibbles; kInt8: int8 (out, in); kBf16Blocked: bf16
  const void* scales;    // kInt4: bfloat16 (groups, out, 2); kInt8: float32 (out, groups)
  const float* zeros;    // kInt8: float32 (out, groups) or null; kInt4: unused
  int64_t group;         // inputs per group (kBf16Blocked: in padded to a multiple of 32)
  int64_t block;         // kInt4: rows per block of the layout; kBf16Blocked: 64
};
static_assert(sizeof(QMatrix) == 6 * 8, "QMatrix is six 8-byte fields");
static_assert(sizeof(Layer<float, QMatrix>) == 32 * 8, "a quantized Layer is 32 fields");

// kLanes bytes, zero-extended to int32 lanes.
inline vi widen_bytes(const uint8_t* p) {
#if RADIXLM_VECTOR_BYTES == 64
  const __m512i wide = _mm512_cvtepu8_epi32(load_bytes(p));
#else
  const __m256i wide = _mm256_cvtepu8_epi32(load_bytes(p));
#endif
  vi lanes;
  std::memcpy(&lanes, &wide, sizeof lanes);
  return lanes;
}

// Each row's input sums over each group: sums[r * groups + g], for rows [0, rows).
// A thread's own buffer, reused across calls.
const float* group_sums(const float* x, int64_t x_stride, int64_t rows, int64_t in,
                        int64_t group) {
  thread_local std::vector<float> sums;
  const int64_t groups = in / group;
  sums.assign(rows * groups, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * x_stride;
    for (int64_t g = 0; g < groups; ++g) {
      vf acc = {};
      int64_t k = g * group;
      const int64_t end = k + group;
      for (; k + kLanes <= end; k += kLanes) acc += load(xr + k);
      float s = hsum(acc);
      for (; k < end; ++k) s += xr[k];
      sums[r * groups + g] = s;
    }
  }
  return sums.data();
}

// --- int4 ------------------------------------------------------------------

// Vectors of kLanes bytes per input row of a block (the block's B/2 bytes), and
// the rows an int4 tile takes: its accumulators (2 NB vectors a row) use at most
// half of the registers.
template <int NB>
constexpr int int4_tile_rows() {
  return std::max(1, kRegisters / 2 / (2 * NB));
}

// Rows [m0, m0 + R) of y, block columns [n0, n0 + B) (B = 2 NB kLanes): y =
// x W^T (+ bias), over the block's codes `blk` ((in, B/2) bytes).
template <typename W, int NB, int R>
void int4_block_tile(const Product<W, QMatrix>& p, const float* sums, int64_t m0, int64_t n0,
                     const uint8_t* blk) {
  constexpr int64_t kHalf = NB * kLanes;  // bytes per input row: B / 2
  const QMatrix& q = p.wt;
  const int64_t groups = p.in / q.group;
  const uint32_t* pairs = static_cast<const uint32_t*>(q.scales);  // (scale, zero) bfloat16
  vf total[R][2 * NB] = {};
  for (int64_t g = 0; g < groups; ++g) {
    vf acc[R][2 * NB] = {};
    const uint8_t* b = blk + g * q.group * kHalf;
    for (int64_t k = g * q.group; k < (g + 1) * q.group; ++k, b += kHalf) {
      __builtin_prefetch(b + 8 * kHalf, 0, 2);
      vf lo[NB], hi[NB];
      for (int j = 0; j < NB; ++j) {
        const vi v = widen_bytes(b + j * kLanes);
        lo[j] = __builtin_convertvector(v & 15, vf);
        hi[j] = __builtin_convertvector(v >> 4, vf);
      }
      for (int r = 0; r < R; ++r) {
        const vf xr = splat(p.x[(m0 + r) * p.x_stride + k]);
        for (int j = 0; j < NB; ++j) {
          acc[r][j] += lo[j] * xr;
          acc[r][NB + j] += hi[j] * xr;
        }
      }
    }
    // Rows n0 + j kLanes (low nibbles) and n0 + B/2 + j kLanes (high ones).
    for (int h = 0; h < 2 * NB; ++h) {
      const int64_t n = n0 + (h < NB ? h * kLanes : kHalf + (h - NB) * kLanes);
      vu u;
      std::memcpy(&u, pairs + g * p.out + n, sizeof u);
      vf scale, zero;
      const vu scale_bits = u << 16, zero_bits = u & 0xffff0000u;
      std::memcpy(&scale, &scale_bits, sizeof scale);
      std::memcpy(&zero, &zero_bits, sizeof zero);
      const vf offset = zero - scale * 8.0f;
      for (int r = 0; r < R; ++r)
        total[r][h] += acc[r][h] * scale + offset * sums[(m0 + r) * groups + g];
    }
  }
  for (int h = 0; h < 2 * NB; ++h) {
    const int64_t n = n0 + (h < NB ? h * kLanes : kHalf + (h - NB) * kLanes);
    const vf bias = p.bias ? load(p.bias + n) : vf{};
    for (int r = 0; r < R; ++r) store(p.y + (m0 + r) * p.y_stride + n, total[r][h] + bias);
  }
}

#if RADIXLM_INT8_DOT && defined(__AVX512VBMI__)
#define RADIXLM_INT4_DOT 1

// int4 on VNNI dot products (a block of 64 rows; the inputs quantized per 32 as for
// int8, int8_dot_cpu.h): 4 inputs' codes of a row gathered into one int32 lane by
// a two-source byte permute (a block's 4 input rows are 128 adjacent bytes), the
// nibbles split (unsigned 0..15: vpdpbusd's unsigned side, the inputs its signed
// one), 4 products a lane a row per instruction. A weight group's
// sum(code * x) is dx * sum(code * xq) summed over its input groups of 32, then
// scaled as the float path scales it.
constexpr int kInt4DotRows = 2;  // rows of a tile: 8 integer + 8 float accumulators

// The permutes' byte indices: for output rows [16 h, 16 h + 16) of the block's low
// nibbles (h = 0, 1), each lane the 4 input rows' bytes of its row: input rows 0, 1
// from the first source (bytes 32 i + j), 2, 3 from the second (64 + 32 (i - 2) + j).
inline __m512i int4_gather(int h) {
  alignas(64) uint8_t idx[64];
  for (int lane = 0; lane < 16; ++lane)
    for (int i = 0; i < 4; ++i)
      idx[4 * lane + i] = static_cast<uint8_t>((i < 2 ? 32 * i : 64 + 32 * (i - 2)) + 16 * h + lane);
  return _mm512_load_si512(idx);
}

template <typename W, int R>
void int4_dot_block_tile(const Product<W, QMatrix>& p, const DotInputs& in, const float* sums,
                         int64_t m0, int64_t n0, const uint8_t* blk) {
  const QMatrix& q = p.wt;
  const int64_t groups = p.in / q.group, chunks = p.in / kDotChunk;
  const uint32_t* pairs = static_cast<const uint32_t*>(q.scales);  // (scale, zero) bfloat16
  static const __m512i gather0 = int4_gather(0), gather1 = int4_gather(1);  // built once
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  __m512 total[R][4];
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 4; ++h) total[r][h] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[R][4];  // sum(code * x) of the group, rows n0 + 16 h
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < 4; ++h) acc[r][h] = _mm512_setzero_ps();
    for (int64_t k0 = g * q.group; k0 < (g + 1) * q.group; k0 += kDotGroup) {
      __m512i dots[R][4];
      for (int r = 0; r < R; ++r)
        for (int h = 0; h < 4; ++h) dots[r][h] = _mm512_setzero_si512();
      for (int64_t k = k0; k < k0 + kDotGroup; k += 4) {
        const uint8_t* b = blk + k * 32;  // input rows k .. k + 3: 128 bytes
        __builtin_prefetch(b + 1024, 0, 2);
        const __m512i first = _mm512_loadu_si512(b), second = _mm512_loadu_si512(b + 64);
        const __m512i t0 = _mm512_permutex2var_epi8(first, gather0, second);
        const __m512i t1 = _mm512_permutex2var_epi8(first, gather1, second);
        const __m512i codes[4] = {
            _mm512_and_si512(t0, nibble), _mm512_and_si512(t1, nibble),
            _mm512_and_si512(_mm512_srli_epi16(t0, 4), nibble),
            _mm512_and_si512(_mm512_srli_epi16(t1, 4), nibble)};
        for (int r = 0; r < R; ++r) {
          int32_t four;
          std::memcpy(&four, in.codes.data() + (m0 + r) * p.in + k, sizeof four);
          const __m512i xq = _mm512_set1_epi32(four);
          for (int h = 0; h < 4; ++h) dots[r][h] = _mm512_dpbusd_epi32(dots[r][h], codes[h], xq);
        }
      }
      const int64_t xg = k0 / kDotGroup;  // the inputs' group of 32
      for (int r = 0; r < R; ++r) {
        const float dx = in.scales[((m0 + r) * chunks + xg / 2) * 16 + 8 * (xg % 2)];
        const __m512 scale = _mm512_set1_ps(dx);
        for (int h = 0; h < 4; ++h)
          acc[r][h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[r][h]), scale, acc[r][h]);
      }
    }
    for (int h = 0; h < 4; ++h) {  // rows n0 + 16 h: low nibbles h = 0, 1; high 2, 3
      const int64_t n = n0 + 16 * h;
      vu u;
      std::memcpy(&u, pairs + g * p.out + n, sizeof u);
      const vu scale_bits = u << 16, zero_bits = u & 0xffff0000u;
      __m512 scale, zero;
      std::memcpy(&scale, &scale_bits, sizeof scale);
      std::memcpy(&zero, &zero_bits, sizeof zero);
      const __m512 offset = _mm512_fnmadd_ps(scale, _mm512_set1_ps(8.0f), zero);
      for (int r = 0; r < R; ++r) {
        const __m512 part = _mm512_fmadd_ps(acc[r][h], scale, total[r][h]);
        total[r][h] = _mm512_fmadd_ps(offset, _mm512_set1_ps(sums[(m0 + r) * groups + g]), part);
      }
    }
  }
  for (int h = 0; h < 4; ++h) {
    const int64_t n = n0 + 16 * h;
    const vf bias = p.bias ? load(p.bias + n) : vf{};
    for (int r = 0; r < R; ++r) {
      vf t;
      std::memcpy(&t, &total[r][h], sizeof t);
      store(p.y + (m0 + r) * p.y_stride + n, t + bias);
    }
  }
}
#else
#define RADIXLM_INT4_DOT 0
#endif

// Whether int4 products of K inputs in groups of `group`, blocks of `block` rows,
// run on dot products in this build.
inline bool int4_dot_takes(int64_t K, int64_t group, int64_t block) {
  return RADIXLM_INT4_DOT && block == 64 && K % kDotChunk == 0 && group % kDotGroup == 0;
}

// The rows past the last whole block: (in, rest/2) bytes, byte (k, j) rows 2j and
// 2j + 1; one value at a time (widths here are multiples of the block). With
// `dots`, the inputs as the dot products read them (xq dx), as the blocks do.
template <typename W>
void int4_tail(const Product<W, QMatrix>& p, const float* sums, int64_t rows, int64_t whole,
               const float* dots = nullptr) {
  const QMatrix& q = p.wt;
  const int64_t rest = p.out - whole, groups = p.in / q.group;
  const uint8_t* codes = q.codes + whole * p.in / 2;
  const uint16_t* pairs = static_cast<const uint16_t*>(q.scales);
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t n = whole; n < p.out; ++n) {
      const int64_t j = (n - whole) / 2;
      const int shift = (n - whole) % 2 ? 4 : 0;
      float y = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        float acc = 0.0f;
        for (int64_t k = g * q.group; k < (g + 1) * q.group; ++k)
          acc += float((codes[k * rest / 2 + j] >> shift) & 15) *
                 (dots ? dots[m * p.in + k] : p.x[m * p.x_stride + k]);
        const float scale = to_float(pairs[(g * p.out + n) * 2]);
        const float zero = to_float(pairs[(g * p.out + n) * 2 + 1]);
        y += acc * scale + (zero - 8.0f * scale) * sums[m * groups + g];
      }
      p.y[m * p.y_stride + n] = y + (p.bias ? to_float(p.bias[n]) : 0.0f);
    }
  }
}

// Units [u0, u1) of the product (its blocks, the tail the last unit).
template <typename W, int NB>
void int4_run(const Product<W, QMatrix>& p, int64_t rows, int64_t u0, int64_t u1) {
  constexpr int R = int4_tile_rows<NB>();
  const QMatrix& q = p.wt;
  const int64_t blocks = p.out / q.block, whole = blocks * q.block;
#if RADIXLM_INT4_DOT
  if (int4_dot_takes(p.in, q.group, q.block)) {
    thread_local DotInputs in;
    thread_local std::vector<float> read;  // the inputs as the dot products read them
    quantize_inputs(p.x, p.x_stride, rows, p.in, in);
    read_inputs(in, read);
    const float* sums = group_sums(read.data(), p.in, rows, p.in, q.group);
    for (int64_t u = u0; u < u1; ++u) {
      if (u == blocks) {
        int4_tail(p, sums, rows, whole, read.data());
        continue;
      }
      const uint8_t* blk = q.codes + u * q.block * p.in / 2;
      int64_t m = 0;
      for (; m + kInt4DotRows <= rows; m += kInt4DotRows)
        int4_dot_block_tile<W, kInt4DotRows>(p, in, sums, m, u * q.block, blk);
      for (; m < rows; ++m) int4_dot_block_tile<W, 1>(p, in, sums, m, u * q.block, blk);
    }
    return;
  }
#endif
  const float* sums = group_sums(p.x, p.x_stride, rows, p.in, q.group);
  for (int64_t u = u0; u < u1; ++u) {
    if (u == blocks) {
      int4_tail(p, sums, rows, whole);
      continue;
    }
    const uint8_t* blk = q.codes + u * q.block * p.in / 2;
    int64_t m = 0;
    for (; m + R <= rows; m += R) int4_block_tile<W, NB, R>(p, sums, m, u * q.block, blk);
    for (; m < rows; ++m) int4_block_tile<W, NB, 1>(p, sums, m, u * q.block, blk);
  }
}

// --- int8 ------------------------------------------------------------------

constexpr int kInt8Rows = 4;                          // rows of a tile
constexpr int kInt8Cols = kRegisters == 32 ? 4 : 2;  // weight rows of a tile

// y[m][n] = dot + bias[n] + sum_g zero[n][g] * (row m's input sum over g).
template <typename W>
inline void int8_finish(const Product<W, QMatrix>& p, const float* sums, int64_t m, int64_t n,
                        float dot) {
  const QMatrix& q = p.wt;
  float y = dot + (p.bias ? to_float(p.bias[n]) : 0.0f);
  if (q.zeros) {
    const int64_t groups = p.in / q.group;
    for (int64_t g = 0; g < groups; ++g) y += q.zeros[n * groups + g] * sums[m * groups + g];
  }
  p.y[m * p.y_stride + n] = y;
}

// y[m0 + r][n0 + c] for r < R, c < C: a register tile of R C accumulators; each
// widened weight vector serves R input rows, each input vector C weight rows.
template <typename W, int R, int C>
void int8_tile(const Product<W, QMatrix>& p, const float* sums, int64_t m0, int64_t n0) {
  const QMatrix& q = p.wt;
  const int64_t groups = p.in / q.group;
  const int8_t* codes = reinterpret_cast<const int8_t*>(q.codes) + n0 * p.in;
  const float* scale = static_cast<const float*>(q.scales) + n0 * groups;
  vf acc[R][C] = {};
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t k = g * q.group; k < (g + 1) * q.group; k += kLanes) {
      vf w[C];
      for (int c = 0; c < C; ++c) w[c] = load(codes + c * p.in + k) * scale[c * groups + g];
      for (int r = 0; r < R; ++r) {
        const vf xv = load(p.x + (m0 + r) * p.x_stride + k);
        for (int c = 0; c < C; ++c) acc[r][c] += w[c] * xv;
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) int8_finish(p, sums, m0 + r, n0 + c, hsum(acc[r][c]));
}

template <typename W, int C>
void int8_columns(const Product<W, QMatrix>& p, const float* sums, int64_t rows, int64_t n0) {
  int64_t m = 0;
  for (; m + kInt8Rows <= rows; m += kInt8Rows) int8_tile<W, kInt8Rows, C>(p, sums, m, n0);
  for (; m < rows; ++m) int8_tile<W, 1, C>(p, sums, m, n0);
}

#if RADIXLM_INT8_DOT
template <typename W, int C>
void int8_dot_columns(const Product<W, QMatrix>& p, const DotInputs& in, const float* sums,
                      __m512i idx, int64_t rows, int64_t n0) {
  const QMatrix& q = p.wt;
  const int8_t* codes = reinterpret_cast<const int8_t*>(q.codes);
  const float* scale = static_cast<const float*>(q.scales);
  int64_t m = 0;
  for (; m + kDotRows <= rows; m += kDotRows) {
    float y[kDotRows][C];
    dot_tile<kDotRows, C>(in, codes, scale, q.group, idx, m, n0, y);
    for (int r = 0; r < kDotRows; ++r)
      for (int c = 0; c < C; ++c) int8_finish(p, sums, m + r, n0 + c, y[r][c]);
  }
  for (; m < rows; ++m) {
    float y[1][C];
    dot_tile<1, C>(in, codes, scale, q.group, idx, m, n0, y);
    for (int c = 0; c < C; ++c) int8_finish(p, sums, m, n0 + c, y[0][c]);
  }
}
#endif

// Units [u0, u1) of the product: its columns in tiles of kInt8Cols.
template <typename W>
void int8_run(const Product<W, QMatrix>& p, int64_t rows, int64_t u0, int64_t u1) {
  const QMatrix& q = p.wt;
  const int64_t n0 = u0 * kInt8Cols, n1 = std::min(p.out, u1 * kInt8Cols);
#if RADIXLM_INT8_DOT
  if (dot_takes(p.in, q.group)) {
    thread_local DotInputs in;  // each thread quantizes the rows itself: no barrier
    thread_local std::vector<float> read;
    quantize_inputs(p.x, p.x_stride, rows, p.in, in);
    const float* sums = nullptr;  // of the inputs as read, for the zero points
    if (q.zeros) {
      read_inputs(in, read);
      sums = group_sums(read.data(), p.in, rows, p.in, q.group);
    }
    const __m512i idx = lane_groups(q.group);
    int64_t n = n0;
    for (; n + kDotCols <= n1; n += kDotCols) int8_dot_columns<W, kDotCols>(p, in, sums, idx, rows, n);
    for (; n < n1; ++n) int8_dot_columns<W, 1>(p, in, sums, idx, rows, n);
    return;
  }
#endif
  const float* sums = q.zeros ? group_sums(p.x, p.x_stride, rows, p.in, q.group) : nullptr;
  int64_t n = n0;
  for (; n + kInt8Cols <= n1; n += kInt8Cols) int8_columns<W, kInt8Cols>(p, sums, rows, n);
  for (; n < n1; ++n) int8_columns<W, 1>(p, sums, rows, n);
}

// --- bfloat16 in oneDNN's blocked layout ----------------------------------------

// kBf16Blocked: the bfloat16 copy oneDNN's matmul reads (Linear.prepare's packed
// weight), as it lays it out for AVX512-BF16: the inputs padded with zeros to a
// multiple of 32 (P, the QMatrix's group), output rows in blocks of 64 (the rows past
// the last whole block zeros too), a block (P/2, 64, 2): for each pair of adjacent
// inputs, the block's 64 rows' two weights side by side. Each
// vdpbf16ps takes one 64-byte line of it: 16 outputs x 2 inputs, against one input
// pair broadcast to every lane, so a line is used by every input row without sums
// across lanes. At 8 input rows it reads weights from memory ~1.3x as fast as the
// row-major tiles of row_tile_bf16 (benchmarks/cpu_tiles.cpp: 42-48 against 34-36
// GB/s on a 2-core AMD EPYC with AVX512-BF16). Each output is its lane's sum over
// the input pairs in order, then the bias: the same whatever rows share the call.
#if RADIXLM_BF16_DOT
constexpr int64_t kPairBlock = 64;       // output rows of a block
constexpr int64_t kPairVector = 16;      // output rows of a vector (a unit)
constexpr int kPairVectors = 4;          // vectors of a block
constexpr int kPairRows = 6;             // input rows of a pass (4 x 6 accumulators)
constexpr int64_t kPairPrefetch = 4096;  // weights ahead (8 KB), as row_tile_bf16

// Vectors [v0, v0 + V) of the block `blk` against input rows [0, M) (xp: each row's
// input pairs, `pairs` apart): y[m][v * 16 + j], a row of 64 outputs per input row.
// Each vector's line is prefetched 8 KB ahead (one prefetch per input pair and vector:
// at 4 rows 1.15x faster than one for every second line).
template <int M, int V>
void pair_tile(const uint16_t* blk, int v0, const uint32_t* xp, int64_t pairs, float* y) {
  __m512 acc[M][V];
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < V; ++v) acc[m][v] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < pairs; ++kp) {
    const uint16_t* line = blk + (kp * kPairBlock + v0 * kPairVector) * 2;
    for (int v = 0; v < V; ++v) __builtin_prefetch(line + kPairPrefetch + v * 32, 0, 2);
    __m512bh wv[V];
    for (int v = 0; v < V; ++v) wv[v] = (__m512bh)_mm512_loadu_si512(line + v * 32);
    for (int m = 0; m < M; ++m) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(int(xp[m * pairs + kp]));
      for (int v = 0; v < V; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], xv, wv[v]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < V; ++v)
      _mm512_storeu_ps(y + m * kPairBlock + (v0 + v) * kPairVector, acc[m][v]);
}

template <int V>
void pair_rows(const uint16_t* blk, int v0, const uint32_t* xp, int64_t pairs, int64_t rows,
               float* y) {
  switch (rows) {
    case 1: pair_tile<1, V>(blk, v0, xp, pairs, y); break;
    case 2: pair_tile<2, V>(blk, v0, xp, pairs, y); break;
    case 3: pair_tile<3, V>(blk, v0, xp, pairs, y); break;
    case 4: pair_tile<4, V>(blk, v0, xp, pairs, y); break;
    case 5: pair_tile<5, V>(blk, v0, xp, pairs, y); break;
    default: pair_tile<6, V>(blk, v0, xp, pairs, y); break;
  }
}

// Units [u0, u1) of the product (vectors of 16 output rows): the units of one block
// at a time, against the input rows kPairRows at a time (the chunks after the first
// read the block's lines again from L2: a 64 x 8,192 block is 1 MB). Chunks of 6 rows
// against a block's 4 vectors measured 1.05-1.10x faster at 12-32 rows than chunks of 8
// against 3 vectors and then 1, and alike at 7-8 (Llama-3.2-1B's shape, 2 threads).
template <typename W>
void pair_run(const Product<W, QMatrix>& p, int64_t rows, int64_t u0, int64_t u1) {
  const int64_t padded = p.wt.group, pairs = (p.in + 1) / 2;  // the pairs past: zeros
  thread_local std::vector<float> tile;  // (chunk rows, 64) sums of one block
  tile.resize(kPairRows * kPairBlock);
  // the inputs rounded to bfloat16, each row's pairs (its odd last input with a zero)
  const auto* x_pairs = reinterpret_cast<const uint32_t*>(
      inputs_as_bf16(p.x, p.x_stride, rows, p.in, 2 * pairs));
  for (int64_t u = u0; u < u1;) {
    const int64_t b = u / kPairVectors;
    const int v0 = int(u % kPairVectors);
    const int vn = int(std::min<int64_t>(u1 - u, kPairVectors - v0));
    const auto* blk = reinterpret_cast<const uint16_t*>(p.wt.codes) + b * kPairBlock * padded;
    const int64_t n0 = b * kPairBlock + v0 * kPairVector;
    const int64_t n1 = std::min(p.out, n0 + vn * kPairVector);
    for (int64_t m0 = 0; m0 < rows; m0 += kPairRows) {
      const int64_t mn = std::min<int64_t>(kPairRows, rows - m0);
      const uint32_t* xp = x_pairs + m0 * pairs;
      switch (vn) {
        case 1: pair_rows<1>(blk, v0, xp, pairs, mn, tile.data()); break;
        case 2: pair_rows<2>(blk, v0, xp, pairs, mn, tile.data()); break;
        case 3: pair_rows<3>(blk, v0, xp, pairs, mn, tile.data()); break;
        default: pair_rows<4>(blk, v0, xp, pairs, mn, tile.data()); break;
      }
      for (int64_t m = 0; m < mn; ++m) {
        const float* t = tile.data() + m * kPairBlock + v0 * kPairVector;
        float* y = p.y + (m0 + m) * p.y_stride;
        for (int64_t n = n0; n < n1; ++n)
          y[n] = t[n - n0] + (p.bias ? to_float(p.bias[n]) : 0.0f);
      }
    }
    u += vn;
  }
}
#endif

// --- the operand's product ----------------------------------------------------

// The product's work in units a thread takes whole: int4 blocks (the rows past the
// last whole block one more unit), int8 tiles of kInt8Cols columns, blocked
// bfloat16's vectors of 16 output rows.
template <typename W>
int64_t product_units(const Product<W, QMatrix>& p) {
  if (p.wt.kind == kInt8) return (p.out + kInt8Cols - 1) / kInt8Cols;
#if RADIXLM_BF16_DOT
  if (p.wt.kind == kBf16Blocked) return (p.out + kPairVector - 1) / kPairVector;
#endif
  const int64_t blocks = p.out / p.wt.block;
  return blocks + (blocks * p.wt.block < p.out ? 1 : 0);
}

// Units [u0, u1) of y = x W^T + bias for rows [0, rows).
template <typename W>
void product_run(const Product<W, QMatrix>& p, int64_t rows, int64_t u0, int64_t u1) {
  if (u0 >= u1) return;
  if (p.wt.kind == kInt8) {
    int8_run(p, rows, u0, u1);
    return;
  }
#if RADIXLM_BF16_DOT
  if (p.wt.kind == kBf16Blocked) {
    pair_run(p, rows, u0, u1);
    return;
  }
#endif
  switch (p.wt.block / (2 * kLanes)) {  // NB: byte vectors per input row of a block
    case 1: int4_run<W, 1>(p, rows, u0, u1); break;
    case 2: int4_run<W, 2>(p, rows, u0, u1); break;
    default: int4_run<W, 4>(p, rows, u0, u1); break;
  }
}

// This thread's share of y = x W^T + bias for rows [0, rows): what decode_step's
// attention_in and mlp call for a QMatrix (found by argument-dependent lookup).
template <typename W>
void product_share(const Product<W, QMatrix>& p, int64_t rows, int thread, int threads) {
  const int64_t units = product_units(p);
  product_run(p, rows, units * thread / threads, units * (thread + 1) / threads);
}

// Whether this build takes the operand (the Python side checks first; this keeps a
// wrong one from reading past its codes).
bool supported(const QMatrix& q, int64_t in, int64_t out) {
  if (q.kind == kBf16Blocked)  // inputs padded to the next multiple of 32
    return RADIXLM_BF16_DOT && q.block == 64 && q.group == (in + 31) / 32 * 32;
  if (q.group <= 0 || in % q.group) return false;
  if (q.kind == kInt8) return q.group % kLanes == 0;
  if (q.kind != kInt4 || q.block <= 0 || in % 2 || out % 2) return false;
  const int64_t nb = q.block / (2 * kLanes);
  return q.block % (2 * kLanes) == 0 && (nb == 1 || nb == 2 || nb == 4);
}

template <typename W>
bool layers_supported(const Layer<W, QMatrix>* layers, int64_t num_layers, int64_t hidden_size,
                      int64_t attn_dim, int64_t width, int64_t intermediate) {
  for (int64_t l = 0; l < num_layers; ++l) {
    const Layer<W, QMatrix>& w = layers[l];
    if (!supported(w.qkv, hidden_size, width) || !supported(w.o, attn_dim, hidden_size) ||
        !supported(w.gate_up, hidden_size, 2 * intermediate) ||
        !supported(w.down, intermediate, hidden_size))
      return false;
  }
  return true;
}

// --- mixture of experts --------------------------------------------------------

// One phase of several products (each active expert's): their units numbered one
// product after the other, the whole range split evenly over the threads.
struct Phase {
  std::vector<Product<float, QMatrix>> products;
  std::vector<int64_t> rows;
  std::vector<int64_t> first = {0};  // prefix sums of the products' units

  void add(const Product<float, QMatrix>& p, int64_t n) {
    products.push_back(p);
    rows.push_back(n);
    first.push_back(first.back() + product_units(p));
  }

  void share(int thread, int threads) const {
    const int64_t total = first.back();
    const int64_t u0 = total * thread / threads, u1 = total * (thread + 1) / threads;
    for (size_t i = 0; i < products.size(); ++i) {
      const int64_t a = std::max(u0, first[i]), b = std::min(u1, first[i + 1]);
      if (a < b) product_run(products[i], rows[i], a - first[i], b - first[i]);
    }
  }
};

// out (T, H) = sum_j weights[t][j] down_e(silu(gate_e x_t) * up_e x_t), e = ids[t][j],
// summed in float32 in the order j = 0 .. k-1. experts: (E, 2) QMatrix, each
// expert's gate_up (2I, H; the gate rows first) and down (H, I). The (token,
// choice) slots are grouped by expert, so each chosen expert runs once on all of
// its tokens; every expert's gate_up products are one phase over the threads, then
// SwiGLU, then the down products, then the weighted sums: one parallel region.
int moe(const float* x, int64_t T, int64_t H, int64_t I, const QMatrix* experts, int64_t E,
        const int64_t* ids, const float* weights, int64_t k, float* out) {
  const int64_t S = T * k;
  std::vector<int64_t> start(E + 1, 0), order(S), position(S);
  for (int64_t s = 0; s < S; ++s) {
    if (ids[s] < 0 || ids[s] >= E) return 1;
    ++start[ids[s] + 1];
  }
  for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t s = 0; s < S; ++s) {  // stable: an expert's slots in token order
    position[s] = next[ids[s]]++;
    order[position[s]] = s;
  }
  std::vector<float> buffer(S * (2 * H + 2 * I));
  float* gathered = buffer.data();  // (S, H): slot i's token's x
  float* gate_up = gathered + S * H;  // (S, 2I)
  float* down = gate_up + S * 2 * I;  // (S, H)
  for (int64_t i = 0; i < S; ++i)
    std::memcpy(gathered + i * H, x + (order[i] / k) * H, H * sizeof(float));
  Phase ups, downs;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t first = start[e], n = start[e + 1] - start[e];
    if (n == 0) continue;  // an expert no token chose is never read
    const QMatrix& up = experts[2 * e];
    const QMatrix& dn = experts[2 * e + 1];
    if (!supported(up, H, 2 * I) || !supported(dn, I, H)) return 1;
    ups.add({gathered + first * H, H, up, nullptr, gate_up + first * 2 * I, 2 * I, H, 2 * I}, n);
    downs.add({gate_up + first * 2 * I, 2 * I, dn, nullptr, down + first * H, H, I, H}, n);
  }
#pragma omp parallel
  {
    const int thread = omp_get_thread_num(), threads = omp_get_num_threads();
    ups.share(thread, threads);
#pragma omp barrier
    silu_mul_share(gate_up, S, I, thread, threads);  // silu(gate) * up, over the gate
#pragma omp barrier
    downs.share(thread, threads);
#pragma omp barrier
    const int64_t units = (H + kLanes - 1) / kLanes;
    const int64_t c0 = units * thread / threads * kLanes;
    const int64_t c1 = std::min(H, units * (thread + 1) / threads * kLanes);
    for (int64_t t = 0; t < T; ++t) {
      int64_t c = c0;
      for (; c + kLanes <= c1; c += kLanes) {
        vf acc = {};
        for (int64_t j = 0; j < k; ++j)
          acc += load(down + position[t * k + j] * H + c) * weights[t * k + j];
        store(out + t * H + c, acc);
      }
      for (; c < c1; ++c) {
        float acc = 0.0f;
        for (int64_t j = 0; j < k; ++j) acc += down[position[t * k + j] * H + c] * weights[t * k + j];
        out[t * H + c] = acc;
      }
    }
  }
  return 0;
}

// --- a decode step of mixture-of-experts layers ---------------------------------

// A layer whose MLP is a mixture of quantized experts (Qwen3-MoE's, Mixtral's): its
// attention half a Layer's (gate_up, down and their biases unused), then a float
// router and the experts, as ``moe`` takes them.
template <typename W>
struct MoeLayer {
  Layer<W, QMatrix> attention;
  const W* router;          // (E, H): the router's weight, contiguous
  const QMatrix* experts;   // (E, 2): each expert's gate_up (2I, H) and down (H, I)
  int64_t num_experts;      // E
  int64_t top_k;            // experts a token takes
  int64_t normalize;        // 1: the chosen probabilities renormalised to sum to 1
  int64_t intermediate;     // I, each expert's
};
static_assert(sizeof(MoeLayer<float>) == 38 * 8, "a MoeLayer is 38 fields");

template <typename W>
const Layer<W, QMatrix>& attention_part(const MoeLayer<W>& w) {
  return w.attention;
}

// The router's choice for one token, as radixlm.runtime.models.moe.route makes it:
// softmax over the E logits in float32, the k largest (the lower id first among
// equals), renormalised when asked.
inline void route_token(const float* logits, int64_t E, int64_t k, bool normalize,
                        int64_t* ids, float* weights) {
  float top = logits[0];
  for (int64_t e = 1; e < E; ++e) top = std::max(top, logits[e]);
  std::vector<float> probs(E);
  float sum = 0.0f;
  for (int64_t e = 0; e < E; ++e) sum += probs[e] = std::exp(logits[e] - top);
  for (int64_t e = 0; e < E; ++e) probs[e] /= sum;
  std::vector<int64_t> order(E);
  for (int64_t e = 0; e < E; ++e) order[e] = e;
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
    return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
  });
  float chosen = 0.0f;
  for (int64_t j = 0; j < k; ++j) chosen += weights[j] = probs[ids[j] = order[j]];
  if (normalize)
    for (int64_t j = 0; j < k; ++j) weights[j] /= chosen;
}

// The layer's second half: o_proj, the residual add and post-attention norm, the
// router (a float product), each token's route, then the experts (moe) into out.
// Returns 0, 1 for an expert this build does not take.
template <typename W>
int layer_mlp(const MoeLayer<W>& w, const float* attn, float* residual, float eps,
              float* scratch, float* /*gate_up*/, float* out, int64_t rows, int64_t hidden_size,
              int64_t attn_dim, int64_t /*intermediate*/) {
  const Layer<W, QMatrix>& a = w.attention;
  const int64_t E = w.num_experts, k = w.top_k;
  if (k < 1 || k > E) return 1;
  std::vector<float> logits(rows * E);
  const Product<W, QMatrix> o_proj{attn, attn_dim, a.o, a.o_bias, scratch, hidden_size,
                                   attn_dim, hidden_size};
  const Product<W> router{scratch, hidden_size, w.router, nullptr, logits.data(), E,
                          hidden_size, E};
#pragma omp parallel
  {
    const int thread = omp_get_thread_num(), threads = omp_get_num_threads();
    product_share(o_proj, rows, thread, threads);
#pragma omp barrier
    add_and_norm_share(residual, scratch, a.post_norm, eps, scratch, rows, hidden_size, thread,
                       threads);
#pragma omp barrier
    product_share(router, rows, thread, threads);
  }
  std::vector<int64_t> ids(rows * k);
  std::vector<float> weights(rows * k);
  for (int64_t m = 0; m < rows; ++m)
    route_token(logits.data() + m * E, E, k, w.normalize != 0, ids.data() + m * k,
                weights.data() + m * k);
  return moe(scratch, rows, hidden_size, w.intermediate, w.experts, E, ids.data(),
             weights.data(), k, out);
}

template <typename W>
bool moe_layers_supported(const MoeLayer<W>* layers, int64_t num_layers, int64_t hidden_size,
                          int64_t attn_dim, int64_t width) {
  for (int64_t l = 0; l < num_layers; ++l) {
    const Layer<W, QMatrix>& a = layers[l].attention;
    if (!supported(a.qkv, hidden_size, width) || !supported(a.o, attn_dim, hidden_size))
      return false;
  }
  return true;
}

}  // namespace

extern "C" {

// A mixture-of-experts MLP over quantized experts (see moe): x (T, H) float32;
// experts (E, 2) QMatrix; ids (T, k) int64; weights (T, k) float32; out (T, H)
// float32. Returns 0, 1 for an id outside [0, E) or an expert this build does not
// take.
int radixlm_quant_moe(const float* x, int64_t T, int64_t H, int64_t I, const QMatrix* experts,
                      int64_t E, const int64_t* ids, const float* weights, int64_t k, float* out) {
  return moe(x, T, H, I, experts, E, ids, weights, k, out);
}

// The build's vector width in floats (what a QMatrix's groups and int4 blocks must
// be multiples of: see supported()).
int radixlm_quant_lanes() { return kLanes; }

// Whether this build takes kBf16Blocked matrices (AVX512-BF16 dot products): 1, else 0.
int radixlm_quant_bf16_blocked() { return RADIXLM_BF16_DOT; }

// Whether `blocked` holds the bfloat16 matrix `plain` (out, in) in kBf16Blocked's
// layout with its inputs padded to `padded` (even, at least in), the padding zeros:
// 1, else 0. What the Python side checks once of oneDNN's copy before the products
// read it (oneDNN chooses its layout per CPU and shape; blocked must hold
// ceil(out / 64) * 64 * padded values).
int radixlm_bf16_blocked_matches(const uint16_t* plain, const uint16_t* blocked, int64_t out,
                                 int64_t in, int64_t padded) {
  if (padded < in || padded % 2) return 0;
  const int64_t blocks = (out + 63) / 64, pairs = padded / 2;
  int64_t wrong = 0;  // a row of a block at a time: its pairs against the plain row's
#pragma omp parallel for schedule(static) reduction(+ : wrong)
  for (int64_t b = 0; b < blocks; ++b) {
    const uint16_t* block = blocked + b * pairs * 128;
    for (int64_t o = 0; o < 64; ++o) {
      const int64_t n = b * 64 + o;
      const uint16_t* row = n < out ? plain + n * in : nullptr;
      for (int64_t kp = 0; kp < pairs; ++kp) {
        const int64_t k = 2 * kp;
        const uint16_t* got = block + kp * 128 + o * 2;
        if (row != nullptr && k + 1 < in) {  // a whole pair: one 4-byte compare
          wrong += std::memcmp(got, row + k, 4) != 0;
        } else {
          wrong += got[0] != (row != nullptr && k < in ? row[k] : 0) || got[1] != 0;
        }
      }
    }
  }
  return wrong == 0;
}

// Whether int8 products of K inputs in groups of `group` run on VNNI dot products
// of int8-quantized inputs (int8_dot_cpu.h) in this build: 1, else 0 (float32).
int radixlm_quant_int8_dot(int64_t K, int64_t group) { return dot_takes(K, group) ? 1 : 0; }

// The same for int4 products in blocks of `block` rows (int4_dot_block_tile).
int radixlm_quant_int4_dot(int64_t K, int64_t group, int64_t block) {
  return int4_dot_takes(K, group, block) ? 1 : 0;
}

}  // extern "C"

// radixlm_quant_linear_<W>: y (rows, out) float32 = x (rows, in) float32 @ W^T
// (+ bias, W values, or null) for a QMatrix W. Returns 0, 1 for an operand this
// build does not take.
//
// radixlm_quant_decode_step_<W>[_<C>]: small_batch_cpu.cpp's decode step with
// layers of QMatrix operands (num_layers x 32 fields: Layer<W, QMatrix>), over a
// float pool of W or, with _<C>, a quantized one (as small_batch_codes_cpu.cpp's).
// Returns 0, 1 for shapes or operands it does not take, 2 when out of memory.
#define RADIXLM_QUANT_LINEAR(SUFFIX, W)                                                    \
  extern "C" int radixlm_quant_linear_##SUFFIX(const float* x, const QMatrix* wt,           \
                                               const W* bias, float* y, int64_t rows,       \
                                               int64_t in, int64_t out) {                   \
    if (!supported(*wt, in, out)) return 1;                                                  \
    const Product<W, QMatrix> p{x, in, *wt, bias, y, out, in, out};                          \
    _Pragma("omp parallel") product_share(p, rows, omp_get_thread_num(),                     \
                                          omp_get_num_threads());                            \
    return 0;                                                                                \
  }

#define RADIXLM_QUANT_DECODE_STEP(SUFFIX, W, KV)                                             \
  extern "C" int radixlm_quant_decode_step_##SUFFIX(                                        \
      const Layer<W, QMatrix>* layers, int64_t num_layers, const W* final_norm, float eps,  \
      float* residual, const float* cos, const float* sin, KV* k_pool, KV* v_pool,          \
      int64_t pool_layer_stride, const int64_t* table, int64_t table_stride,                \
      const int64_t* rows_of, const int64_t* prefix_lens, const int64_t* out_loc,           \
      float* out, int64_t rows, int64_t hidden_size, int64_t heads, int64_t kv_heads,       \
      int64_t head_dim, int64_t intermediate, float scale, uint16_t* k_scales,              \
      uint16_t* v_scales, int64_t scale_layer_stride) {                                     \
    if (!layers_supported(layers, num_layers, hidden_size, heads * head_dim,                \
                          (heads + 2 * kv_heads) * head_dim, intermediate))                 \
      return 1;                                                                             \
    return decode_step<W, KV, QMatrix>(                                                     \
        layers, num_layers, final_norm, eps, residual, cos, sin, k_pool, v_pool,            \
        pool_layer_stride, table, table_stride, rows_of, prefix_lens, out_loc, out, rows,   \
        hidden_size, heads, kv_heads, head_dim, intermediate, scale, k_scales, v_scales,    \
        scale_layer_stride);                                                                \
  }

// radixlm_quant_moe_decode_step_<W>[_<C>]: the same over MoeLayer<W> layers
// (num_layers x 38 fields); `intermediate` is unused (each layer says its experts').
#define RADIXLM_QUANT_MOE_STEP(SUFFIX, W, KV)                                               \
  extern "C" int radixlm_quant_moe_decode_step_##SUFFIX(                                   \
      const MoeLayer<W>* layers, int64_t num_layers, const W* final_norm, float eps,       \
      float* residual, const float* cos, const float* sin, KV* k_pool, KV* v_pool,          \
      int64_t pool_layer_stride, const int64_t* table, int64_t table_stride,                \
      const int64_t* rows_of, const int64_t* prefix_lens, const int64_t* out_loc,           \
      float* out, int64_t rows, int64_t hidden_size, int64_t heads, int64_t kv_heads,       \
      int64_t head_dim, int64_t /*intermediate*/, float scale, uint16_t* k_scales,          \
      uint16_t* v_scales, int64_t scale_layer_stride) {                                     \
    if (!moe_layers_supported(layers, num_layers, hidden_size, heads * head_dim,            \
                              (heads + 2 * kv_heads) * head_dim))                           \
      return 1;                                                                             \
    return decode_step<W, KV, QMatrix>(                                                     \
        layers, num_layers, final_norm, eps, residual, cos, sin, k_pool, v_pool,            \
        pool_layer_stride, table, table_stride, rows_of, prefix_lens, out_loc, out, rows,   \
        hidden_size, heads, kv_heads, head_dim, 0, scale, k_scales, v_scales,               \
        scale_layer_stride);                                                                \
  }

RADIXLM_QUANT_LINEAR(f32, float)
RADIXLM_QUANT_LINEAR(bf16, uint16_t)
RADIXLM_QUANT_DECODE_STEP(f32, float, float)
RADIXLM_QUANT_DECODE_STEP(bf16, uint16_t, uint16_t)
RADIXLM_QUANT_DECODE_STEP(f32_i8, float, int8_t)
RADIXLM_QUANT_DECODE_STEP(f32_e4m3, float, Fp8E4M3)
RADIXLM_QUANT_DECODE_STEP(f32_e5m2, float, Fp8E5M2)
RADIXLM_QUANT_DECODE_STEP(bf16_i8, uint16_t, int8_t)
RADIXLM_QUANT_DECODE_STEP(bf16_e4m3, uint16_t, Fp8E4M3)
RADIXLM_QUANT_DECODE_STEP(bf16_e5m2, uint16_t, Fp8E5M2)
RADIXLM_QUANT_MOE_STEP(f32, float, float)
RADIXLM_QUANT_MOE_STEP(bf16, uint16_t, uint16_t)
RADIXLM_QUANT_MOE_STEP(f32_i8, float, int8_t)
RADIXLM_QUANT_MOE_STEP(f32_e4m3, float, Fp8E4M3)
RADIXLM_QUANT_MOE_STEP(f32_e5m2, float, Fp8E5M2)
RADIXLM_QUANT_MOE_STEP(bf16_i8, uint16_t, int8_t)
RADIXLM_QUANT_MOE_STEP(bf16_e4m3, uint16_t, Fp8E4M3)
RADIXLM_QUANT_MOE_STEP(bf16_e5m2, uint16_t, Fp8E5M2)
