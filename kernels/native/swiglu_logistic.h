// The logistic's constants (MLAS's MlasLogisticConstants, Eigen's coefficients), shared by every path,
// and one column of SwiGLU in scalar code (the portable path, and the AVX2 path's last columns). Its
// functions have internal linkage: each translation unit compiles its own for its target (with FMA in
// hardware or libm's fmaf), never another unit's.
#pragma once

namespace specedge {

struct LogisticConstants {
  float lower, upper, a9, a7, a5, a3, a1, b10, b8, b6, b4, b2, b0;
};

constexpr LogisticConstants kLogistic{-18.0f,
                                      18.0f,
                                      4.37031012579801e-11f,
                                      1.15627324459942e-07f,
                                      6.08574864600143e-05f,
                                      8.51377133304701e-03f,
                                      2.48287947061529e-01f,
                                      6.10247389755681e-13f,
                                      5.76102136993427e-09f,
                                      6.29106785017040e-06f,
                                      1.70198817374094e-03f,
                                      1.16817656904453e-01f,
                                      9.93151921023180e-01f};

namespace {

// silu(g) * u (swiglu.h): max(-18, g) and min(18, .) as vmaxps and vminps take them.
inline float swiglu_one(float g, float u) {
  const LogisticConstants& c = kLogistic;
  float x = c.lower > g ? c.lower : g;
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
  return (g * s) * u;
}

}  // namespace
}  // namespace specedge
