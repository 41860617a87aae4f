// SwiGLU's portable path and its choice of instruction set (the arithmetic is told in swiglu.h).
#include "swiglu.h"

#include <cstring>

#include "cpu_features.h"
#include "swiglu_logistic.h"

namespace specedge {

void swiglu_portable(const float* gate, const float* up, int64_t n, float* out) {
  const LogisticConstants& c = kLogistic;
  for (int64_t j = 0; j < n; ++j) {
    const float g = gate[j];
    float x = c.lower > g ? c.lower : g;  // max(lower, g) and min(upper, .) as vmaxps and vminps take them
    x = c.upper < x ? c.upper : x;
    const float x2 = x * x;
    float p = __builtin_fmaf(x2, c.a9, c.a7);
    p = __builtin_fmaf(x2, p, c.a5);
    p = __builtin_fmaf(x2, p, c.a3);
    p = __builtin_fmaf(x2, p, c.a1);
    float q = __builtin_fmaf(x2, c.b10, c.b8);
    q = __builtin_fmaf(x2, q, c.b6);
    q = __builtin_fmaf(x2, q, c.b4);
    q = __builtin_fmaf(x2, q, c.b2);
    q = __builtin_fmaf(x2, q, c.b0);
    p = x * p;
    const float r = p / q + 0.5f;
    const float s = 0.0f > r ? 0.0f : r;
    out[j] = (g * s) * up[j];
  }
}

int available_swiglu_isas(SwigluIsa* out, int capacity) {
  int n = 0;
  auto add = [&](const SwigluIsa& isa) {
    if (n < capacity) out[n++] = isa;
  };
#if defined(__x86_64__) || defined(_M_X64)
  const CpuFeatures& cpu = cpu_features();
  if (cpu.avx2 && cpu.fma && cpu.avx512f) add(SwigluIsa{"avx512", swiglu_avx512});
  if (cpu.avx2 && cpu.fma) add(SwigluIsa{"avx2", swiglu_avx2});
#endif
  add(SwigluIsa{"portable", swiglu_portable});
  return n;
}

SwigluFn swiglu_for(const char* matmul_isa) {
  SwigluIsa isas[3];
  available_swiglu_isas(isas, 3);
  if (matmul_isa != nullptr && std::strcmp(matmul_isa, "portable") == 0) return swiglu_portable;
  return isas[0].fn;  // the best here: every path gives the same bits
}

}  // namespace specedge
