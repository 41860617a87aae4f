// AVX-512 VNNI path: vpdpbusd multiplies the unsigned 4-bit codes by int8 activations and adds each
// lane's four products into int32, exactly (no int16 step, no saturation). One zmm register holds two
// consecutive 32-byte chunks of one column group (8 columns x 16 k, read as one stream), their 4-byte
// column words interleaved by one vpermd: lane 2c holds column c at the first 8 k, lane 2c + 1 at the
// next 8. A 64-bit broadcast of the row's activations (arranged once a pass, arrange_avx512_vnni)
// then feeds both halves: 64 multiply-adds per broadcast. Each 64-byte pair of chunks is unpacked once
// per tile of up to 16 rows; the int32 sums stay in registers (32 zmm with EVEX) and the two lanes of
// a column are added at the block's end (exact), the float accumulators live in the output rows (L1).
// The epilogue is the portable path's, column by column.
#if defined(__x86_64__) || defined(_M_X64)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,avx512f,avx512bw,avx512vl,avx512vnni"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC target("avx2,avx512f,avx512bw,avx512vl,avx512vnni")
#endif

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "int4_matmul.h"

namespace specedge {
namespace {

// The fewest tiles of at most kMaxRows rows for m rows, as even as they go (17 rows: 9 and 8).
constexpr int kMaxRows = 16;
int64_t tile_count(int64_t m) { return (m + kMaxRows - 1) / kMaxRows; }
int64_t tile_rows(int64_t m, int64_t t, int64_t r0) { return (m - r0) / (tile_count(m) - t); }
// bytes of the weight stream prefetched ahead (the next groups of a task follow in memory; a prefetch
// past the end never faults)
constexpr int64_t kAhead = 4096;
constexpr int64_t kL1Activations = 24 << 10;  // bytes of a tile's activations a span of K may hold

inline __m512i broadcast8(const int8_t* p) {
  int64_t v;
  std::memcpy(&v, p, 8);
  return _mm512_set1_epi64(v);
}

// Rows [r0, r0 + R) of column group g. xt: the tile's activations as arrange_avx512_vnni lays them out,
// 16 bytes of each row per 16 k. A: independent sums per row (a dpbusd waits 4 cycles for its sum; a
// tile of few rows needs more chains to keep the unit busy), added at the block's end.
template <int R, int A = (R <= 2 ? 4 : R <= 8 ? 2 : 1)>
void tile(const Int4Weights& w, const QuantizedRows& x, int64_t g, int64_t r0, int64_t b0, int64_t b1, float* y) {
  const int64_t k = w.k, blocks = k / w.block, pairs = w.block / 16;
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512i interleave = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
  const uint8_t* p = w.packed + g * (k / 8) * 32 + b0 * w.block * 4;
  const int8_t* xt = x.tiled + r0 * k + b0 * w.block * R;
  float* y0 = y + r0 * w.n + g * 8;
  if (b0 == 0) {
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(y0 + r * w.n, _mm256_setzero_ps());
  }
  for (int64_t b = b0; b < b1; ++b) {
    __m512i d[R][A];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      for (int a = 0; a < A; ++a) d[r][a] = _mm512_setzero_si512();
    }
    for (int64_t s = 0; s < pairs; s += 2) {  // pairs (block / 16) is even
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h, p += 64, xt += 16 * R) {
        _mm_prefetch(reinterpret_cast<const char*>(p + kAhead), _MM_HINT_T0);
        const __m512i packed = _mm512_permutexvar_epi32(interleave, _mm512_loadu_si512(p));
        const __m512i lo = _mm512_and_si512(packed, low);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
        const int a = A == 4 ? 2 * h : 0, a1 = A == 1 ? a : a + 1;
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          d[r][a] = _mm512_dpbusd_epi32(d[r][a], lo, broadcast8(xt + 16 * r));
          d[r][a1] = _mm512_dpbusd_epi32(d[r][a1], hi, broadcast8(xt + 16 * r + 8));
        }
      }
    }
    const int64_t at = (g * blocks + b) * 8;
    const __m256i zero = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.zeros + at)));
    const __m256 scale = _mm256_loadu_ps(w.scales + at);
    for (int r = 0; r < R; ++r) {
      const int64_t xb = (r0 + r) * blocks + b;
      __m512i lanes = d[r][0];
      for (int a = 1; a < A; ++a) lanes = _mm512_add_epi32(lanes, d[r][a]);
      // column c = lane 2c + lane 2c + 1: the odd lanes shifted onto the even ones, then the even ones kept
      const __m256i sum = _mm512_cvtepi64_epi32(_mm512_add_epi32(lanes, _mm512_srli_epi64(lanes, 32)));
      const __m256i corr = _mm256_mullo_epi32(zero, _mm256_set1_epi32(x.sum[xb]));
      const __m256 t = _mm256_cvtepi32_ps(_mm256_sub_epi32(sum, corr));
      const __m256 sc = _mm256_mul_ps(scale, _mm256_set1_ps(x.scale[xb]));
      float* yr = y0 + r * w.n;
      _mm256_storeu_ps(yr, _mm256_add_ps(_mm256_loadu_ps(yr), _mm256_mul_ps(t, sc)));
    }
  }
}

using TileFn = void (*)(const Int4Weights&, const QuantizedRows&, int64_t, int64_t, int64_t, int64_t, float*);

template <int... R>
constexpr std::array<TileFn, sizeof...(R)> tiles(std::integer_sequence<int, R...>) {
  return {&tile<R + 1>...};
}

}  // namespace

void arrange_avx512_vnni(const int8_t* q, int64_t m, int64_t k, int8_t* out) {
  for (int64_t t = 0, r0 = 0; t < tile_count(m); ++t) {
    const int64_t rows = tile_rows(m, t, r0);
    int8_t* o = out + r0 * k;
    for (int64_t j = 0; j < k; j += 16) {
      for (int64_t r = 0; r < rows; ++r, o += 16) {
        const int8_t* src = q + (r0 + r) * k + j;  // k j..j+3, j+8..j+11 (low nibbles), j+4..j+7, j+12..j+15
        std::memcpy(o, src, 4);
        std::memcpy(o + 4, src + 8, 4);
        std::memcpy(o + 8, src + 4, 4);
        std::memcpy(o + 12, src + 12, 4);
      }
    }
    r0 += rows;
  }
}

void groups_avx512_vnni(const Int4Weights& w, const QuantizedRows& x, int64_t g0, int64_t g1, float* y) {
  static constexpr auto by_rows = tiles(std::make_integer_sequence<int, kMaxRows>{});
  // K in spans whose activations stay in L1 while every group of the range reads them (one row:
  // the whole of K, one weight stream); a span's blocks add onto the sums of the spans before it,
  // block by block in order, as in one pass
  const int64_t blocks = w.k / w.block;
  const int64_t most = std::max<int64_t>(1, kL1Activations / (std::min<int64_t>(x.m, kMaxRows) * w.block));
  const int64_t spans = (blocks + most - 1) / most, span = (blocks + spans - 1) / spans;
  for (int64_t b0 = 0; b0 < blocks; b0 += span) {
    const int64_t b1 = std::min(blocks, b0 + span);
    for (int64_t g = g0; g < g1; ++g) {
      for (int64_t t = 0, r0 = 0; t < tile_count(x.m); ++t) {
        const int64_t rows = tile_rows(x.m, t, r0);
        by_rows[rows - 1](w, x, g, r0, b0, b1, y);
        r0 += rows;
      }
    }
  }
}

}  // namespace specedge

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
