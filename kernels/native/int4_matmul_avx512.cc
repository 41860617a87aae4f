// AVX-512 VNNI path: vpdpbusd multiplies the unsigned 4-bit codes by int8 activations and adds each
// lane's four products into int32, exactly (no int16 step, no saturation). It reads layout 2: a panel's
// 128 bytes per 8 k are two zmm loads; lane c of the first holds column c (of 16) at k..k+3 in its low
// nibbles and k+4..k+7 in its high ones, the second columns 16..31. So one 32-bit broadcast of a row's activations
// (4 k, read straight from the quantized row) feeds two multiply-adds of 64 products each - the
// broadcasts, not the weight stream, are what a tile of many rows waits on, and this halves them. Each
// panel's chunk is unpacked once per tile of up to 8 rows (two int32 sums a row: 16 of the 32 zmm,
// beside the unpacked chunk); K is taken in spans whose activations stay in L1 while the task's panels
// read them. The epilogue is the portable path's, 16 columns at once.
#if defined(__x86_64__) || defined(_M_X64)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,avx512f,avx512bw,avx512vl,avx512vnni"))), \
                             apply_to = function)
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

// The fewest tiles of at most kMaxRows rows for m rows, as even as they go (9 rows: 5 and 4).
constexpr int kMaxRows = 8;
int64_t tile_count(int64_t m) { return (m + kMaxRows - 1) / kMaxRows; }
int64_t tile_rows(int64_t m, int64_t t, int64_t r0) { return (m - r0) / (tile_count(m) - t); }
// bytes of the weight stream prefetched ahead (the next panels of a task follow in memory; a prefetch
// past the end never faults)
constexpr int64_t kAhead = 4096;
constexpr int64_t kL1Activations = 24 << 10;  // bytes of a tile's activations a span of K may hold
constexpr int64_t kColumns = 32, kBytes = 128;  // this path reads layout 2: panels of 32 columns

inline __m512i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Rows [r0, r0 + R) of panel p over blocks [b0, b1): y holds the sums of the blocks before b0.
template <int R>
void tile(const Int4Weights& w, const QuantizedRows& x, int64_t p, int64_t r0, int64_t b0, int64_t b1, float* y) {
  const int64_t k = w.k, blocks = k / w.block, steps = w.block / 8;
  const __m512i low = _mm512_set1_epi8(0x0F);
  const uint8_t* c = w.packed + p * (k / 8) * kBytes + b0 * steps * kBytes;
  float* y0 = y + r0 * w.n + p * kColumns;
  if (b0 == 0) {
    for (int r = 0; r < R; ++r) {
      _mm512_storeu_ps(y0 + r * w.n, _mm512_setzero_ps());
      _mm512_storeu_ps(y0 + r * w.n + 16, _mm512_setzero_ps());
    }
  }
  for (int64_t b = b0; b < b1; ++b) {
    __m512i d[R][2];
    for (int r = 0; r < R; ++r) d[r][0] = d[r][1] = _mm512_setzero_si512();
    const int8_t* xk = x.q + r0 * k + b * w.block;
    for (int64_t s = 0; s < steps; ++s, c += kBytes, xk += 8) {
      _mm_prefetch(reinterpret_cast<const char*>(c + kAhead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(c + kAhead + 64), _MM_HINT_T0);
      const __m512i w0 = _mm512_loadu_si512(c), w1 = _mm512_loadu_si512(c + 64);
      const __m512i lo0 = _mm512_and_si512(w0, low), lo1 = _mm512_and_si512(w1, low);
      const __m512i hi0 = _mm512_and_si512(_mm512_srli_epi16(w0, 4), low);
      const __m512i hi1 = _mm512_and_si512(_mm512_srli_epi16(w1, 4), low);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512i xl = broadcast4(xk + r * k), xh = broadcast4(xk + r * k + 4);
        d[r][0] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(d[r][0], lo0, xl), hi0, xh);
        d[r][1] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(d[r][1], lo1, xl), hi1, xh);
      }
    }
    const int64_t at = (p * blocks + b) * kColumns;
    const __m512i zero[2] = {
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.zeros + at))),
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.zeros + at + 16)))};
    const __m512 scale[2] = {_mm512_loadu_ps(w.scales + at), _mm512_loadu_ps(w.scales + at + 16)};
    for (int r = 0; r < R; ++r) {
      const int64_t xb = (r0 + r) * blocks + b;
      const __m512i xsum = _mm512_set1_epi32(x.sum[xb]);
      const __m512 xs = _mm512_set1_ps(x.scale[xb]);
      float* yr = y0 + r * w.n;
      for (int h = 0; h < 2; ++h) {
        const __m512 t = _mm512_cvtepi32_ps(_mm512_sub_epi32(d[r][h], _mm512_mullo_epi32(zero[h], xsum)));
        const __m512 sc = _mm512_mul_ps(scale[h], xs);
        _mm512_storeu_ps(yr + 16 * h, _mm512_add_ps(_mm512_loadu_ps(yr + 16 * h), _mm512_mul_ps(t, sc)));
      }
    }
  }
}

using TileFn = void (*)(const Int4Weights&, const QuantizedRows&, int64_t, int64_t, int64_t, int64_t, float*);

template <int... R>
constexpr std::array<TileFn, sizeof...(R)> tiles(std::integer_sequence<int, R...>) {
  return {&tile<R + 1>...};
}

}  // namespace

void panels_avx512_vnni(const Int4Weights& w, const QuantizedRows& x, int64_t p0, int64_t p1, float* y) {
  static constexpr auto by_rows = tiles(std::make_integer_sequence<int, kMaxRows>{});
  // K in spans whose activations stay in L1 while every panel of the range reads them (one row: the
  // whole of K, one weight stream); a span's blocks add onto the sums of the spans before it, block by
  // block in order, as in one pass
  const int64_t blocks = w.k / w.block;
  const int64_t most = std::max<int64_t>(1, kL1Activations / (std::min<int64_t>(x.m, kMaxRows) * w.block));
  const int64_t spans = (blocks + most - 1) / most, span = (blocks + spans - 1) / spans;
  for (int64_t b0 = 0; b0 < blocks; b0 += span) {
    const int64_t b1 = std::min(blocks, b0 + span);
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t t = 0, r0 = 0; t < tile_count(x.m); ++t) {
        const int64_t rows = tile_rows(x.m, t, r0);
        by_rows[rows - 1](w, x, p, r0, b0, b1, y);
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
