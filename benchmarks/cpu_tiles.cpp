// How fast a few-row bfloat16 product reads its weights from memory, by weight layout:
// AVX512-BF16 dot products of 8 input rows, on 2 threads, over 1 GiB of weights.
//
//   rows         today's few-row product (small_batch_cpu.cpp, row_tile_bf16): weights
//                (N, K) row-major, tiles of 3 weight rows, each vdpbf16ps the dot of 32
//                weights of a row with 32 inputs of an input row, summed across lanes
//                at the tile's end; the next tile's lines prefetched as tile_ahead does
//   interleaved  the same tiles with their 3 rows interleaved a cache line at a time
//                (one stream a tile)
//   pairs        oneDNN's way: blocks of 48 outputs, each (K/2, 48, 2) (two adjacent
//                inputs of an output side by side), each vdpbf16ps 16 outputs x 2 inputs
//                against one broadcast input pair; no sums across lanes
//
// A standalone program (not radixlm's kernels): it measures whether a layout of the
// product's own would read faster than today's tiles, checking each layout's outputs
// against a plain sum first. Build and run from the repository root:
//   g++ -O3 -march=native -fopenmp benchmarks/cpu_tiles.cpp -o /tmp/cpu_tiles
//   OMP_NUM_THREADS=2 /tmp/cpu_tiles
// Needs a CPU with AVX512-BF16 (benchmarks/README.md, "Model families").
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int kRows = 8;     // input rows
constexpr int kTile = 3;     // weight rows a tile (rows, interleaved)
constexpr int kVectors = 3;  // output vectors a block (pairs): 48 outputs
constexpr int64_t kK = 2048;
constexpr int64_t kPairPrefetch = 4096;  // weights ahead (pairs), 8 KB

float from_bf16(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// A tile of kTile weight rows against kRows inputs (rows, K apart; interleaved: a
// cache line of each row in turn); y: kRows x kTile outputs, kTile apart.
template <bool Interleaved>
void dot_tile(const uint16_t* w, const uint16_t* x, float* y) {
  __m512 acc[kTile][kRows];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  for (int64_t k = 0; k < kK; k += 32) {
    __m512bh wv[kTile];
    for (int q = 0; q < kTile; ++q) {
      const uint16_t* p = Interleaved ? w + (k / 32 * kTile + q) * 32 : w + q * kK + k;
      __builtin_prefetch(p + kTile * kK, 0, 2);  // the same line of the next tile
      wv[q] = (__m512bh)_mm512_loadu_si512(p);
    }
    for (int m = 0; m < kRows; ++m) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + m * kK + k);
      for (int q = 0; q < kTile; ++q) acc[q][m] = _mm512_dpbf16_ps(acc[q][m], xv, wv[q]);
    }
  }
  for (int q = 0; q < kTile; ++q)
    for (int m = 0; m < kRows; ++m) y[m * kTile + q] = _mm512_reduce_add_ps(acc[q][m]);
}

// A block of 16 x kVectors outputs in pairs layout against kRows inputs (x_pairs: each
// row's K/2 input pairs); y: kRows x 48 outputs.
void pair_block(const uint16_t* w, const uint32_t* x_pairs, float* y) {
  __m512 acc[kRows][kVectors];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < kK / 2; ++kp) {
    const uint16_t* line = w + kp * kVectors * 32;
    __builtin_prefetch(line + kPairPrefetch, 0, 2);
    __builtin_prefetch(line + kPairPrefetch + 32, 0, 2);
    __m512bh wv[kVectors];
    for (int v = 0; v < kVectors; ++v) wv[v] = (__m512bh)_mm512_loadu_si512(line + v * 32);
    for (int m = 0; m < kRows; ++m) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(int(x_pairs[m * (kK / 2) + kp]));
      for (int v = 0; v < kVectors; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], xv, wv[v]);
    }
  }
  for (int m = 0; m < kRows; ++m)
    for (int v = 0; v < kVectors; ++v) _mm512_storeu_ps(y + m * 48 + v * 16, acc[m][v]);
}

// The weights of `outputs` rows (row-major, K each) in each layout.
struct Layouts {
  std::vector<uint16_t> rows, interleaved, pairs;
};

Layouts lay_out(const std::vector<uint16_t>& w, int64_t outputs) {
  Layouts l{w, std::vector<uint16_t>(w.size()), std::vector<uint16_t>(w.size())};
  for (int64_t t = 0; t < outputs / kTile; ++t)
    for (int64_t k = 0; k < kK; k += 32)
      for (int q = 0; q < kTile; ++q)
        std::memcpy(&l.interleaved[t * kTile * kK + (k / 32 * kTile + q) * 32],
                    &w[(t * kTile + q) * kK + k], 64);
  for (int64_t b = 0; b < outputs / 48; ++b)
    for (int64_t kp = 0; kp < kK / 2; ++kp)
      for (int o = 0; o < 48; ++o)
        for (int j = 0; j < 2; ++j)
          l.pairs[b * 48 * kK + (kp * 48 + o) * 2 + j] = w[(b * 48 + o) * kK + 2 * kp + j];
  return l;
}

// Each layout's outputs of 48 weight rows against a plain float sum.
bool check(const std::vector<uint16_t>& x, const std::vector<uint32_t>& x_pairs) {
  std::vector<uint16_t> w(48 * kK);
  for (size_t i = 0; i < w.size(); ++i) w[i] = uint16_t(0x3c00 + (i * 2654435761u >> 24 & 255));
  const Layouts l = lay_out(w, 48);
  float rows[kRows * 48], inter[kRows * 48], pairs[kRows * 48], tile[kRows * kTile];
  for (int t = 0; t < 48 / kTile; ++t) {
    dot_tile<false>(l.rows.data() + t * kTile * kK, x.data(), tile);
    for (int m = 0; m < kRows; ++m)
      for (int q = 0; q < kTile; ++q) rows[m * 48 + t * kTile + q] = tile[m * kTile + q];
    dot_tile<true>(l.interleaved.data() + t * kTile * kK, x.data(), tile);
    for (int m = 0; m < kRows; ++m)
      for (int q = 0; q < kTile; ++q) inter[m * 48 + t * kTile + q] = tile[m * kTile + q];
  }
  pair_block(l.pairs.data(), x_pairs.data(), pairs);
  for (int m = 0; m < kRows; ++m)
    for (int o = 0; o < 48; ++o) {
      double want = 0;
      for (int64_t k = 0; k < kK; ++k) want += double(from_bf16(w[o * kK + k])) * from_bf16(x[m * kK + k]);
      for (float got : {rows[m * 48 + o], inter[m * 48 + o], pairs[m * 48 + o]})
        if (std::fabs(got - want) > 1e-4 * std::fabs(want) + 1e-3) return false;
    }
  return true;
}

}  // namespace

int main() {
  std::vector<uint16_t> x(kRows * kK);
  for (size_t i = 0; i < x.size(); ++i) x[i] = uint16_t(0x3f00 + (i * 40503u >> 8 & 127));
  std::vector<uint32_t> x_pairs(kRows * kK / 2);
  std::memcpy(x_pairs.data(), x.data(), x.size() * sizeof(uint16_t));
  if (!check(x, x_pairs)) {
    std::printf("a layout's outputs differ from the plain sum\n");
    return 1;
  }
  const int64_t outputs = (int64_t(1) << 30) / (kK * 2) / 48 * 48;  // 1 GiB of weights
  std::vector<uint16_t> w(outputs * kK);
  for (size_t i = 0; i < w.size(); ++i) w[i] = uint16_t(0x3c00 + (i * 7 & 255));
  const Layouts l = lay_out(w, outputs);
  w = {};
  const double gb = double(outputs) * kK * 2 / 1e9;
  std::printf("8 input rows, %.2f GB of bfloat16 weights, %d threads; GB/s of weights read\n", gb,
              omp_get_max_threads());
  for (int round = 0; round < 7; ++round) {
    for (int layout = 0; layout < 3; ++layout) {
      const auto start = std::chrono::steady_clock::now();
#pragma omp parallel
      {
        float y[kRows * 48];
        if (layout == 2) {
#pragma omp for schedule(static)
          for (int64_t b = 0; b < outputs / 48; ++b)
            pair_block(l.pairs.data() + b * 48 * kK, x_pairs.data(), y);
        } else {
#pragma omp for schedule(static)
          for (int64_t t = 0; t < outputs / kTile; ++t) {
            if (layout == 0) dot_tile<false>(l.rows.data() + t * kTile * kK, x.data(), y);
            else dot_tile<true>(l.interleaved.data() + t * kTile * kK, x.data(), y);
          }
        }
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("%s %5.1f   ", layout == 0 ? "rows" : layout == 1 ? "interleaved" : "pairs", gb / s);
    }
    std::printf("\n");
  }
  return 0;
}
