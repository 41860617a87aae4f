// SwiGLU's AVX2 path: 8 columns a ymm, a panel's last (panel mod 8) as the portable path computes them.
#if defined(__x86_64__) || defined(_M_X64)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#include <immintrin.h>

#include "swiglu.h"
#include "swiglu_logistic.h"

namespace specedge {

void swiglu_avx2(const float* y, int64_t pairs, int64_t panel, float* out) {
  const LogisticConstants& c = kLogistic;
  const __m256 lower = _mm256_set1_ps(c.lower), upper = _mm256_set1_ps(c.upper), half = _mm256_set1_ps(0.5f);
  const int64_t whole = panel / 8 * 8;
  for (int64_t i = 0; i < pairs; ++i, y += 2 * panel, out += panel) {
    for (int64_t j = 0; j < whole; j += 8) {
      const __m256 g = _mm256_loadu_ps(y + j);
      const __m256 x = _mm256_min_ps(upper, _mm256_max_ps(lower, g));
      const __m256 x2 = _mm256_mul_ps(x, x);
      __m256 p = _mm256_fmadd_ps(x2, _mm256_set1_ps(c.a9), _mm256_set1_ps(c.a7));
      p = _mm256_fmadd_ps(x2, p, _mm256_set1_ps(c.a5));
      p = _mm256_fmadd_ps(x2, p, _mm256_set1_ps(c.a3));
      p = _mm256_fmadd_ps(x2, p, _mm256_set1_ps(c.a1));
      __m256 q = _mm256_fmadd_ps(x2, _mm256_set1_ps(c.b10), _mm256_set1_ps(c.b8));
      q = _mm256_fmadd_ps(x2, q, _mm256_set1_ps(c.b6));
      q = _mm256_fmadd_ps(x2, q, _mm256_set1_ps(c.b4));
      q = _mm256_fmadd_ps(x2, q, _mm256_set1_ps(c.b2));
      q = _mm256_fmadd_ps(x2, q, _mm256_set1_ps(c.b0));
      p = _mm256_mul_ps(x, p);
      const __m256 s = _mm256_max_ps(_mm256_setzero_ps(), _mm256_add_ps(_mm256_div_ps(p, q), half));
      _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_mul_ps(g, s), _mm256_loadu_ps(y + panel + j)));
    }
    for (int64_t j = whole; j < panel; ++j) out[j] = swiglu_one(y[j], y[panel + j]);
  }
}

}  // namespace specedge

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
