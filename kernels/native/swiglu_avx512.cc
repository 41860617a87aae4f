// SwiGLU's AVX-512 path: 16 columns a zmm, a panel's last under a mask.
#if defined(__x86_64__) || defined(_M_X64)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx2,fma,f16c")
#endif

#include <immintrin.h>

#include "swiglu.h"
#include "swiglu_logistic.h"

namespace specedge {

void swiglu_avx512(const float* y, int64_t pairs, int64_t panel, float* out) {
  const LogisticConstants& c = kLogistic;
  const __m512 lower = _mm512_set1_ps(c.lower), upper = _mm512_set1_ps(c.upper), half = _mm512_set1_ps(0.5f);
  for (int64_t i = 0; i < pairs; ++i, y += 2 * panel, out += panel) {
    for (int64_t j = 0; j < panel; j += 16) {
      const __mmask16 in =
          panel - j >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (panel - j)) - 1u);
      const __m512 g = _mm512_maskz_loadu_ps(in, y + j);
      const __m512 x = _mm512_min_ps(upper, _mm512_max_ps(lower, g));
      const __m512 x2 = _mm512_mul_ps(x, x);
      __m512 p = _mm512_fmadd_ps(x2, _mm512_set1_ps(c.a9), _mm512_set1_ps(c.a7));
      p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(c.a5));
      p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(c.a3));
      p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(c.a1));
      __m512 q = _mm512_fmadd_ps(x2, _mm512_set1_ps(c.b10), _mm512_set1_ps(c.b8));
      q = _mm512_fmadd_ps(x2, q, _mm512_set1_ps(c.b6));
      q = _mm512_fmadd_ps(x2, q, _mm512_set1_ps(c.b4));
      q = _mm512_fmadd_ps(x2, q, _mm512_set1_ps(c.b2));
      q = _mm512_fmadd_ps(x2, q, _mm512_set1_ps(c.b0));
      p = _mm512_mul_ps(x, p);
      const __m512 s = _mm512_max_ps(_mm512_setzero_ps(), _mm512_add_ps(_mm512_div_ps(p, q), half));
      const __m512 u = _mm512_maskz_loadu_ps(in, y + panel + j);
      _mm512_mask_storeu_ps(out + j, in, _mm512_mul_ps(_mm512_mul_ps(g, s), u));
    }
  }
}

}  // namespace specedge

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
