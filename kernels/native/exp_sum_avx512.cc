// The tail sum's AVX-512 path: 16 ids a zmm (lane l holds ids l mod 16, as exp_sum.h adds them), two
// zmm of doubles for the 16 lanes, the last ids under a mask; 16 ids whose terms are all 0 skipped
// (adding 0 to a lane leaves its bits).
#if defined(__x86_64__) || defined(_M_X64)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx2,fma,f16c")
#endif

#include <immintrin.h>

#include "exp_avx512.h"
#include "exp_sum.h"

namespace specedge {
namespace {

double sum_avx512(const float* z, int64_t n, float top, float scale, float below) {
  __m512d low = _mm512_setzero_pd(), high = _mm512_setzero_pd();  // lanes 0..7, 8..15
  const __m512 t = _mm512_set1_ps(top), s = _mm512_set1_ps(scale), b = _mm512_set1_ps(below);
  const __m512 floor = _mm512_set1_ps(kExpFloor);
  for (int64_t i = 0; i < n; i += kSumLanes) {
    const __mmask16 in = n - i >= kSumLanes ? static_cast<__mmask16>(0xFFFF)
                                             : static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 v = _mm512_maskz_loadu_ps(in, z + i);
    const __m512 x = _mm512_mul_ps(_mm512_sub_ps(v, t), s);
    const __mmask16 summed = in & _mm512_cmp_ps_mask(v, b, _CMP_LT_OQ);
    if (!(summed & _mm512_cmp_ps_mask(x, floor, _CMP_GE_OQ))) continue;  // all 0 (most of a row's ids): nothing to add
    const __m512 e = _mm512_maskz_mov_ps(summed, exp16(x));
    low = _mm512_add_pd(low, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    high = _mm512_add_pd(high, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
  }
  alignas(64) double lanes[kSumLanes];
  _mm512_store_pd(lanes, low);
  _mm512_store_pd(lanes + 8, high);
  return fold_lanes(lanes);
}

}  // namespace

ExpSumIsa avx512_exp_sum() { return ExpSumIsa{"avx512", sum_avx512}; }

}  // namespace specedge

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
