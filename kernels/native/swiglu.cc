// SwiGLU's portable path and its choice of instruction set (the arithmetic is told in swiglu.h).
#include "swiglu.h"

#include <cstring>

#include "cpu_features.h"
#include "swiglu_logistic.h"

namespace specedge {

void swiglu_portable(const float* y, int64_t pairs, int64_t panel, float* out) {
  for (int64_t i = 0; i < pairs; ++i, y += 2 * panel, out += panel) {
    for (int64_t j = 0; j < panel; ++j) out[j] = swiglu_one(y[j], y[panel + j]);
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
