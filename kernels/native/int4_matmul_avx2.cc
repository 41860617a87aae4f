// AVX2 path: vpmaddubsw multiplies the unsigned 4-bit codes by int8 activations; a pair sum is at most
// 2 * 15 * 127 = 3810, so eight of them add up in int16 without saturating (30,480) before vpmaddwd
// widens them to int32: the integer sums are exact, as on every other path. Each 32-byte chunk of
// packed weights (a group: 8 columns x 8 k) is unpacked once per tile of up to 6 rows, against activations
// broadcast 4 bytes at a time. The int32 block sums and the float accumulators live in memory (L1):
// the 16 registers hold the int16 sums of the tile's rows, the unpacked chunk and the constants.
#if defined(__x86_64__) || defined(_M_X64)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC target("avx2")
#endif

#include <immintrin.h>

#include <cstring>

#include "int4_matmul.h"

namespace specedge {
namespace {

inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Rows [r0, r0 + R) of column group g.
template <int R>
void tile(const Int4Weights& w, const QuantizedRows& x, int64_t g, int64_t r0, float* y) {
  const int64_t k = w.k, blocks = k / w.block, subs = w.block / 32;
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  const uint8_t* p = group_chunks(w, g);
  const int8_t* xr[R];
  float* yr[R];
  for (int r = 0; r < R; ++r) {
    xr[r] = x.q + (r0 + r) * k;
    yr[r] = y + (r0 + r) * w.n + g * 8;
    _mm256_storeu_ps(yr[r], _mm256_setzero_ps());
  }
  for (int64_t b = 0; b < blocks; ++b) {
    alignas(32) int32_t d[R][8] = {};
    for (int64_t s = 0; s < subs; ++s) {
      __m256i h[R];
      for (int r = 0; r < R; ++r) h[r] = _mm256_setzero_si256();
      const int64_t k0 = (b * subs + s) * 32;
#pragma GCC unroll 1
      for (int c = 0; c < 4; ++c, p += chunk_stride(w)) {  // not unrolled: unrolled, GCC spills the products
        const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        const __m256i lo = _mm256_and_si256(packed, low);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
        for (int r = 0; r < R; ++r) {
          const int8_t* xk = xr[r] + k0 + 8 * c;
          h[r] = _mm256_add_epi16(h[r], _mm256_maddubs_epi16(lo, broadcast4(xk)));
          h[r] = _mm256_add_epi16(h[r], _mm256_maddubs_epi16(hi, broadcast4(xk + 4)));
        }
      }
      for (int r = 0; r < R; ++r) {
        __m256i* dr = reinterpret_cast<__m256i*>(d[r]);
        _mm256_store_si256(dr, _mm256_add_epi32(_mm256_load_si256(dr), _mm256_madd_epi16(h[r], ones)));
      }
    }
    const int64_t at = group_block(w, g, b);
    const __m256i zero = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.zeros + at)));
    const __m256 scale = _mm256_loadu_ps(w.scales + at);
    for (int r = 0; r < R; ++r) {
      const int64_t xb = (r0 + r) * blocks + b;
      const __m256i corr = _mm256_mullo_epi32(zero, _mm256_set1_epi32(x.sum[xb]));
      const __m256i sum = _mm256_load_si256(reinterpret_cast<const __m256i*>(d[r]));
      const __m256 t = _mm256_cvtepi32_ps(_mm256_sub_epi32(sum, corr));
      const __m256 sc = _mm256_mul_ps(scale, _mm256_set1_ps(x.scale[xb]));
      _mm256_storeu_ps(yr[r], _mm256_add_ps(_mm256_loadu_ps(yr[r]), _mm256_mul_ps(t, sc)));
    }
  }
}

}  // namespace

void quantize_rows_avx2(const float* x, int64_t m, int64_t k, int64_t block, int8_t* q, float* scale, int32_t* sum) {
  const int64_t blocks = k / block;
  const __m256 sign = _mm256_set1_ps(-0.0f), top = _mm256_set1_ps(127.0f), bottom = _mm256_set1_ps(-127.0f);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + r * k + b * block;
      int8_t* qb = q + r * k + b * block;
      __m256 amax8 = _mm256_setzero_ps();
      for (int64_t i = 0; i < block; i += 8) amax8 = _mm256_max_ps(amax8, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + i)));
      __m128 a4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
      a4 = _mm_max_ps(a4, _mm_movehl_ps(a4, a4));
      a4 = _mm_max_ss(a4, _mm_shuffle_ps(a4, a4, 1));
      const float amax = _mm_cvtss_f32(a4);
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      const __m256 inv8 = _mm256_set1_ps(inv);
      __m256i s8 = _mm256_setzero_si256();
      for (int64_t i = 0; i < block; i += 32) {
        __m256i v[4];
        for (int j = 0; j < 4; ++j) {
          __m256 t = _mm256_mul_ps(_mm256_loadu_ps(xb + i + 8 * j), inv8);
          t = _mm256_max_ps(_mm256_min_ps(t, top), bottom);  // finite inputs: the portable path's clamp
          t = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
          v[j] = _mm256_cvtps_epi32(t);
          s8 = _mm256_add_epi32(s8, v[j]);
        }
        // int32 lanes -> int8, in order: pack to int16 then int8 (each 128-bit lane), then fix the lane order
        const __m256i w01 = _mm256_packs_epi32(v[0], v[1]), w23 = _mm256_packs_epi32(v[2], v[3]);
        const __m256i b = _mm256_packs_epi16(w01, w23);
        const __m256i ordered = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + i), ordered);
      }
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
      scale[r * blocks + b] = amax / 127.0f;
      sum[r * blocks + b] = _mm_cvtsi128_si32(s4);
    }
  }
}

void panels_avx2(const Int4Weights& w, const QuantizedRows& x, int64_t p0, int64_t p1, float* y) {
  each_tile(w, p0, p1, x.m, [&](auto rows, int64_t g, int64_t r0) { tile<decltype(rows)::value>(w, x, g, r0, y); });
}

}  // namespace specedge

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
