// SwiGLU, the epilogue MatMulInt4Rows applies to a gate/up projection (activation = 1): over a row's
// pairs of panels (a gate panel, then its up panel, `panel` columns each), out[j] = silu(gate[j]) * up[j].
// One node where the graph ran four (Split, Sigmoid, Mul, Mul).
//
// Arithmetic, the same on every instruction set (kernels/int4_layout.py models it in numpy): the
// logistic as ONNX Runtime's Sigmoid computes it on x86 with FMA3 (MLAS's LogisticKernelFma3: Eigen's
// rational polynomial), so a fused graph's activations are the bits of the unfused one's there:
//   x = min(18, max(-18, g)); x2 = x * x;
//   p = fma(x2, a9, a7), then p = fma(x2, p, a) for a = a5, a3, a1; p = x * p;
//   q = fma(x2, b10, b8), then q = fma(x2, q, b) for b = b6, b4, b2, b0;
//   s = max(0, p / q + 0.5); out = (g * s) * u   (as Mul(g, Sigmoid(g)) then Mul(., up));
// every operation rounded once, in float (fma: one rounding). Constants: swiglu_logistic.h.
// (For finite inputs: a NaN gives an unspecified output.)
#pragma once

#include <cstdint>

namespace specedge {

// y: `pairs` x (gate panel, up panel); out: `pairs` x panel.
using SwigluFn = void (*)(const float* y, int64_t pairs, int64_t panel, float* out);

struct SwigluIsa {
  const char* name;
  SwigluFn fn;
};

void swiglu_portable(const float* y, int64_t pairs, int64_t panel, float* out);
#if defined(__x86_64__) || defined(_M_X64)
void swiglu_avx2(const float* y, int64_t pairs, int64_t panel, float* out);    // AVX2 with FMA
void swiglu_avx512(const float* y, int64_t pairs, int64_t panel, float* out);  // AVX-512F
#endif

// The instruction sets this CPU runs the epilogue on, best first (the portable path last); returns how many.
int available_swiglu_isas(SwigluIsa* out, int capacity);
// The epilogue that goes with the MatMul's instruction set `matmul_isa` (the portable path for the
// portable MatMul, so that forcing one forces both).
SwigluFn swiglu_for(const char* matmul_isa);

}  // namespace specedge
