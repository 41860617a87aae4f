// The tail sum's AVX2 path: 16 ids two ymm (lane l holds ids l mod 16, as exp_sum.h adds them), four
// ymm of doubles for the 16 lanes, the last n mod 16 ids as the portable path adds them; 16 ids whose
// terms are all 0 skipped (adding 0 to a lane leaves its bits).
#if defined(__x86_64__) || defined(_M_X64)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#include <immintrin.h>

#include "exp_avx2.h"
#include "exp_sum.h"

namespace specedge {
namespace {

// x of 8 logits, and where each is summed with a term that may not be 0 (all bits set).
inline __m256 exponent8(const float* z, __m256 t, __m256 s, __m256 b, __m256* summed) {
  const __m256 v = _mm256_loadu_ps(z);
  const __m256 x = _mm256_mul_ps(_mm256_sub_ps(v, t), s);
  *summed = _mm256_and_ps(_mm256_cmp_ps(v, b, _CMP_LT_OQ), _mm256_cmp_ps(x, _mm256_set1_ps(kExpFloor), _CMP_GE_OQ));
  return x;
}

double sum_avx2(const float* z, int64_t n, float top, float scale, float below) {
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
  const __m256 t = _mm256_set1_ps(top), s = _mm256_set1_ps(scale), b = _mm256_set1_ps(below);
  const int64_t whole = n / kSumLanes * kSumLanes;
  for (int64_t i = 0; i < whole; i += kSumLanes) {
    __m256 in_lo, in_hi;
    const __m256 x_lo = exponent8(z + i, t, s, b, &in_lo), x_hi = exponent8(z + i + 8, t, s, b, &in_hi);
    if (_mm256_testz_ps(_mm256_or_ps(in_lo, in_hi), _mm256_or_ps(in_lo, in_hi))) continue;  // all 0: nothing to add
    const __m256 lo = _mm256_and_ps(exp8(x_lo), in_lo), hi = _mm256_and_ps(exp8(x_hi), in_hi);
    acc[0] = _mm256_add_pd(acc[0], _mm256_cvtps_pd(_mm256_castps256_ps128(lo)));
    acc[1] = _mm256_add_pd(acc[1], _mm256_cvtps_pd(_mm256_extractf128_ps(lo, 1)));
    acc[2] = _mm256_add_pd(acc[2], _mm256_cvtps_pd(_mm256_castps256_ps128(hi)));
    acc[3] = _mm256_add_pd(acc[3], _mm256_cvtps_pd(_mm256_extractf128_ps(hi, 1)));
  }
  alignas(32) double lanes[kSumLanes];
  for (int k = 0; k < 4; ++k) _mm256_store_pd(lanes + 4 * k, acc[k]);
  add_exp_lanes(z, whole, n, top, scale, below, lanes);
  return fold_lanes(lanes);
}

}  // namespace

ExpSumIsa avx2_exp_sum() { return ExpSumIsa{"avx2", sum_avx2}; }

}  // namespace specedge

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
